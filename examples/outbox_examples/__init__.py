"""Example services that use the outbox SDK (run from a checkout of the repository)."""
