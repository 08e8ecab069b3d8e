"""The Feast repo: definitions, store configuration and apply, materialization, online and offline reads."""
