"""Errors of the local stack: :class:`StackError`, defined in the one error tree
(``outbox.core.errors``) and re-exported here, where the stack's modules import it."""

from __future__ import annotations

from outbox.core.errors import StackError

__all__ = ["StackError"]
