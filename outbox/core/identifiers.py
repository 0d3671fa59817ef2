"""Validation and quoting of SQL identifiers that come from configuration.

Only *plain* identifiers pass: lower-case ASCII letters, digits and underscores, not starting
with a digit, at most 63 bytes (PostgreSQL's limit). Everything else is refused, so a name
from an environment variable can never change the meaning of a statement it is put into.
Validated names are still quoted when rendered, so reserved words such as ``user`` are safe.
"""

from __future__ import annotations

import re

from outbox.core.errors import InvalidIdentifierError

__all__ = ["MAX_IDENTIFIER_LENGTH", "qualified_name", "quote_identifier", "validate_identifier"]

MAX_IDENTIFIER_LENGTH = 63
_PLAIN_IDENTIFIER = re.compile(r"[a-z_][a-z0-9_]*", re.ASCII)


def validate_identifier(name: object, *, field: str) -> str:
    """Return ``name`` if it is a plain identifier, else raise naming ``field``."""
    if not isinstance(name, str):
        raise InvalidIdentifierError(f"{field} must be a string, got {type(name).__name__}")
    if not name or len(name) > MAX_IDENTIFIER_LENGTH or not _PLAIN_IDENTIFIER.fullmatch(name):
        raise InvalidIdentifierError(
            f"{field}={name!r} is not a plain SQL identifier: use 1 to "
            f"{MAX_IDENTIFIER_LENGTH} lower-case ASCII letters, digits or underscores, "
            "not starting with a digit (for example 'outbox_events')"
        )
    return name


def quote_identifier(name: str, *, field: str) -> str:
    """Validate ``name`` and return it double-quoted for use in SQL text."""
    return f'"{validate_identifier(name, field=field)}"'


def qualified_name(schema: str, name: str, *, field: str) -> str:
    """``"schema"."name"``, both parts validated."""
    return f"{quote_identifier(schema, field='schema')}.{quote_identifier(name, field=field)}"
