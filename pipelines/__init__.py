"""Spark and GX pipelines: the lake layout, validation, contracts, ingest, gold and the synthetic feed."""
