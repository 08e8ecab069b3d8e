"""The model's input contract and the names it is registered and exported under (see inputs.py)."""
