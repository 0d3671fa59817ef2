"""What the relay checks in PostgreSQL before it leads: each broken assumption, a clear error.

- The role must be allowed to use the lease table (leadership, relay/outbox_relay/database.py).
- The position sequence must have ``CACHE 1``: with a cache, each session draws positions
  from a block of its own, and "every position up to the sequence's last value is drawn"
  (the read floor, relay/outbox_relay/horizon.py) no longer holds: rows could be skipped.
- ``auto`` and ``cleanup`` modes follow CDC: ``wal_level`` must be ``logical`` and the
  publication must exist and include the outbox table, or CDC never delivers and (auto)
  the relay publishes everything itself, (cleanup) the outbox grows for ever.

The replication slot belongs to the connector's settings: ``outbox connect status``
reports its state and ``max_slot_wal_keep_size``; :func:`replication_slots` reads the same
state for the relay's ``/metrics`` at each scrape (relay/outbox_relay/metrics.py), so the
WAL a slot retains is watched live, not only by the nightly ``outbox reconcile``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from outbox.core.errors import ConfigurationError
from outbox.core.tables import OutboxTables
from outbox_relay.settings import RelayMode

__all__ = ["SlotState", "check_database", "replication_slots"]

# Every logical or physical slot of this database: what it retains (from its restart_lsn to
# the current WAL position; on a standby, the last position received), whether a client
# streams from it, and PostgreSQL's own verdict on its WAL (reserved, extended, unreserved,
# lost). pg_replication_slots is readable by every role: the relay's needs no grant.
_SLOTS = """
SELECT slot_name,
       active,
       pg_catalog.pg_wal_lsn_diff(
           CASE WHEN pg_catalog.pg_is_in_recovery() THEN pg_catalog.pg_last_wal_receive_lsn()
                ELSE pg_catalog.pg_current_wal_lsn() END,
           restart_lsn)::bigint,
       wal_status
FROM pg_catalog.pg_replication_slots
WHERE database = pg_catalog.current_database() OR database IS NULL
ORDER BY slot_name
"""


@dataclass(frozen=True, slots=True)
class SlotState:
    """One replication slot as PostgreSQL reports it."""

    name: str
    active: bool
    retained_wal_bytes: int | None
    """WAL kept for it, in bytes; None when it holds none (never used, or invalidated)."""
    wal_status: str | None
    """``reserved``, ``extended``, ``unreserved`` or ``lost`` (None before its first use)."""


def replication_slots(connection: psycopg.Connection[Any]) -> list[SlotState]:
    """The replication slots of the connection's database (and physical ones), by name."""
    return [
        SlotState(
            name=str(name),
            active=bool(active),
            retained_wal_bytes=None if retained is None else max(int(retained), 0),
            wal_status=None if status is None else str(status),
        )
        for name, active, retained, status in connection.execute(_SLOTS).fetchall()
    ]


def _check_sees_every_type(connection: psycopg.Connection[Any], tables: OutboxTables) -> None:
    """Under row-level security (outbox_0008) a role sees only the aggregate types it holds:
    a relay that held some would silently leave the others' events undelivered."""
    outbox = f"{tables.schema}.{tables.outbox}"
    row = connection.execute(
        "SELECT pg_catalog.row_security_active(to_regclass(%s))", (outbox,)
    ).fetchone()
    if row is None or not row[0]:
        return  # the owner, or a schema before outbox_0008
    holds = connection.execute(
        sql.SQL(
            "SELECT EXISTS (SELECT 1 FROM {}.{} a WHERE a.aggregatetype = '*' "
            "AND pg_catalog.pg_has_role(current_user, a.role, 'USAGE'))"
        ).format(sql.Identifier(tables.schema), sql.Identifier(tables.outbox_access))
    ).fetchone()
    if not holds or not holds[0]:
        raise ConfigurationError(
            f"this role sees only some aggregate types' rows of {outbox} (row-level "
            "security): the relay must see every type. Run `outbox db grant ROLE --relay` "
            "(or `outbox db relay-role ROLE`)"
        )


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
    _check_sees_every_type(connection, tables)
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
