"""Errors of the local stack."""

from __future__ import annotations

from outbox.core.errors import OutboxError

__all__ = ["StackError"]


class StackError(OutboxError):
    """A local service could not be installed, started, probed or stopped."""
