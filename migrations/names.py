"""The object names a migration works on: from the running Alembic config, else the environment."""

from __future__ import annotations

import zlib

from alembic import context

from outbox.core.tables import OutboxTables
from outbox.settings import OutboxSettings

__all__ = ["advisory_lock_class", "outbox_tables"]


def outbox_tables() -> OutboxTables:
    settings = context.config.attributes.get("outbox_settings")
    if not isinstance(settings, OutboxSettings):
        settings = OutboxSettings()
    return settings.tables


def advisory_lock_class(tables: OutboxTables) -> int:
    """A stable int4 that names this outbox table's advisory locks (first key of the pair)."""
    return zlib.crc32(f"{tables.schema}.{tables.outbox}".encode()) - 2**31
