"""The application: the `mlops` CLI, the demo, the doctor and the embedded stack."""
