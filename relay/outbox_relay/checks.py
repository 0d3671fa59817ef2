"""What the relay checks in PostgreSQL before it leads: each broken assumption, a clear error.

- The role must be allowed to use the lease table (leadership, relay/outbox_relay/database.py).
- The position sequence must have ``CACHE 1``: with a cache, each session draws positions
  from a block of its own, and "every position up to the sequence's last value is drawn"
  (the read floor, relay/outbox_relay/horizon.py) no longer holds: rows could be skipped.
- ``auto`` and ``cleanup`` modes follow CDC: ``wal_level`` must be ``logical`` and the
  publication must exist and include the outbox table, or CDC never delivers and (auto)
  the relay publishes everything itself, (cleanup) the outbox grows for ever.

The replication slot belongs to the connector's settings: ``outbox connect status``
reports its state and ``max_slot_wal_keep_size``.
"""

from __future__ import annotations

from typing import Any

import psycopg

from outbox.core.errors import ConfigurationError
from outbox.core.tables import OutboxTables
from outbox_relay.settings import RelayMode

__all__ = ["check_database"]


def check_database(
    connection: psycopg.Connection[Any], tables: OutboxTables, mode: RelayMode
) -> None:
    """Raise :class:`ConfigurationError` naming the first broken assumption and its fix."""
    sequence = f"{tables.schema}.{tables.position_sequence}"
    row = connection.execute(
        "SELECT s.seqcache FROM pg_catalog.pg_sequence s WHERE s.seqrelid = to_regclass(%s)",
        (sequence,),
    ).fetchone()
    if row is None:
        raise ConfigurationError(
            f"the position sequence {sequence} does not exist (or this role cannot see it): "
            "run `outbox db upgrade`, and grant the relay with `outbox db grant --relay`"
        )
    if int(row[0]) != 1:
        raise ConfigurationError(
            f"the position sequence {sequence} has CACHE {row[0]}: the relay's read floor "
            f"needs CACHE 1, or it may skip rows. Fix: ALTER SEQUENCE {sequence} CACHE 1"
        )
    lease = f"{tables.schema}.{tables.relay_lease}"
    allowed = connection.execute(
        "SELECT has_table_privilege(to_regclass(%s), 'SELECT, INSERT, UPDATE')", (lease,)
    ).fetchone()
    if not allowed or not allowed[0]:
        raise ConfigurationError(
            f"this role may not use the relay's lease table {lease}: run `outbox db upgrade`, "
            "then `outbox db grant ROLE --relay` (or `outbox db relay-role ROLE`)"
        )
    if mode is RelayMode.POLLING:
        return
    wal_level = connection.execute("SHOW wal_level").fetchone()
    if wal_level is None or wal_level[0] != "logical":
        raise ConfigurationError(
            f"OUTBOX_RELAY_MODE={mode.value} follows CDC, but wal_level is "
            f"{wal_level[0] if wal_level else 'unknown'}: set wal_level = logical in "
            "postgresql.conf and restart PostgreSQL (or use OUTBOX_RELAY_MODE=polling)"
        )
    published = connection.execute(
        "SELECT 1 FROM pg_catalog.pg_publication_tables "
        "WHERE pubname = %s AND schemaname = %s AND tablename = %s",
        (tables.publication, tables.schema, tables.outbox),
    ).fetchone()
    if published is None:
        raise ConfigurationError(
            f"OUTBOX_RELAY_MODE={mode.value} follows CDC, but the publication "
            f"{tables.publication} does not include {tables.schema}.{tables.outbox}: run "
            "`outbox db upgrade` (it creates the publication), or check OUTBOX_PUBLICATION"
        )
