"""Benchmarks: each figure is a ratio against a baseline measured in the same run (`make bench`)."""
