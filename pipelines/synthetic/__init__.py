"""Synthetic, deterministic card-transaction feeds with documented fault injection."""
