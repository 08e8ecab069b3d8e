"""Monitoring: drift against the champion's training reference and live performance on scored traffic."""
