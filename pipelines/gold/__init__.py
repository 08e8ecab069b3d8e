"""Silver -> gold: point-in-time feature tables per entity and event time (Spark)."""
