"""Dead letters: rows the broker refused, kept with the reason until ops replay or discard them.

They are committed events that were never published: no retention deletes them (``outbox db
expire`` leaves them); only a replay (:func:`retry_dead_letters`) or an explicit discard by
id (:func:`discard_dead_letters`, ``outbox relay dead-letters discard ID... --yes``) does.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

import psycopg

from outbox.core.tables import OutboxTables
from outbox_relay.database import libpq_conninfo
from outbox_relay.statements import RelayStatements

__all__ = ["DeadLetter", "discard_dead_letters", "list_dead_letters", "retry_dead_letters"]


@dataclass(frozen=True, slots=True)
class DeadLetter:
    id: uuid.UUID
    aggregate_type: str
    aggregate_id: str
    event_type: str
    reason: str
    failed_at: datetime
    payload_bytes: int


def list_dead_letters(
    database_url: str, tables: OutboxTables, limit: int = 100
) -> list[DeadLetter]:
    statements = RelayStatements(tables)
    with psycopg.connect(libpq_conninfo(database_url)) as connection:
        rows = connection.execute(statements.list_dead_letters, (limit,)).fetchall()
    return [DeadLetter(*row) for row in rows]


def retry_dead_letters(
    database_url: str, tables: OutboxTables, event_ids: Sequence[uuid.UUID] | None = None
) -> list[uuid.UUID]:
    """Move dead letters (these, or all) back into the outbox, in one transaction.

    They get new positions, after everything already waiting: the relay (or CDC) publishes
    them again with their original event ids. Fix the cause first (for example raise the
    broker's and the relay's maximum message size), or they come straight back.
    """
    statements = RelayStatements(tables)
    ids = None if event_ids is None else list(event_ids)
    with psycopg.connect(libpq_conninfo(database_url)) as connection:
        rows = connection.execute(statements.retry_dead_letters, (ids, ids)).fetchall()
    return [row[0] for row in rows]


def discard_dead_letters(
    database_url: str, tables: OutboxTables, event_ids: Sequence[uuid.UUID]
) -> list[uuid.UUID]:
    """Delete these dead letters for good (their events are never published); returns the
    ids that were there, in one transaction."""
    statements = RelayStatements(tables)
    with psycopg.connect(libpq_conninfo(database_url)) as connection:
        rows = connection.execute(statements.discard_dead_letters, (list(event_ids),)).fetchall()
    return [row[0] for row in rows]
