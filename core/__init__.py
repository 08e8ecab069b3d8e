"""The ground layer: settings, storage residency, the stage clock, the error base.

Imports nothing of ours."""
