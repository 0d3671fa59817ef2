"""Maintainers' tools, run from a checkout (``python -m tools.<name>``); not installed."""
