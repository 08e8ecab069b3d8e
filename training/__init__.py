"""Training: dataset, model, loop, metrics, registry and gate, ledger, export, and the pod's CLI."""
