"""The object names a migration works on: the settings of the run, else the environment."""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from outbox.core.tables import OutboxTables
from outbox.settings import OutboxSettings

__all__ = ["advisory_lock_class", "outbox_tables", "settings_in_use"]

_settings: ContextVar[OutboxSettings | None] = ContextVar("outbox_settings", default=None)


@contextmanager
def settings_in_use(settings: OutboxSettings) -> Iterator[None]:
    token = _settings.set(settings)
    try:
        yield
    finally:
        _settings.reset(token)


def outbox_tables() -> OutboxTables:
    settings = _settings.get()
    return (settings if settings is not None else OutboxSettings()).tables


def advisory_lock_class(tables: OutboxTables) -> int:
    """A stable int4 that names this outbox table's advisory locks (first key of the pair)."""
    return zlib.crc32(f"{tables.schema}.{tables.outbox}".encode()) - 2**31
