"""Landing to bronze, quarantine and silver for card transactions (Spark), with reconciliation."""
