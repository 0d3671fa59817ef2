"""The relay's PostgreSQL side: one session that holds leadership and does all the work.

Everything the leader does runs on the connection that holds the leader lock: if that
session dies, the lock is gone *and* so is the only connection that could delete rows, so a
relay that lost leadership cannot remove anything behind the new leader's back.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg

from outbox.core.tables import OutboxTables
from relay.cdc_watch import Offsets
from relay.statements import RelayStatements, leader_lock_key

__all__ = ["Backlog", "OutboxRow", "RelayDatabase", "libpq_conninfo"]


def libpq_conninfo(database_url: str) -> str:
    """``postgresql+psycopg://...`` (SQLAlchemy's form, our setting) as libpq understands it."""
    for prefix in ("postgresql+psycopg://", "postgresql://"):
        if database_url.startswith(prefix):
            return "postgresql://" + database_url[len(prefix) :]
    raise ValueError("OUTBOX_DATABASE_URL must start with postgresql+psycopg:// or postgresql://")


@dataclass(frozen=True, slots=True)
class OutboxRow:
    """One undelivered row, its record's parts already UTF-8 bytes (see relay/statements.py)."""

    id: str
    """The event id, canonical UUID text."""
    aggregate_type: str
    key: bytes
    event_type: bytes
    payload: bytes
    headers: bytes
    traceparent: bytes
    position: int


@dataclass(frozen=True, slots=True)
class Backlog:
    rows: int
    oldest_age_seconds: float
    dead_letters: int


class RelayDatabase:
    """One autocommit session; each statement sees its own, fresh snapshot."""

    def __init__(self, database_url: str, tables: OutboxTables) -> None:
        self._conninfo = libpq_conninfo(database_url)
        self.statements = RelayStatements(tables)
        self._lock_key = leader_lock_key(tables)
        self._connection: psycopg.Connection[Any] | None = None

    def connect(self) -> None:
        self.close()
        self._connection = psycopg.connect(
            self._conninfo, autocommit=True, application_name="outbox-relay", connect_timeout=5
        )

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    @property
    def connection(self) -> psycopg.Connection[Any]:
        if self._connection is None or self._connection.closed:
            raise psycopg.OperationalError("the relay's database session is closed")
        return self._connection

    def try_lead(self) -> bool:
        """Take the leader lock if nobody holds it; True when this session holds it."""
        row = self.connection.execute(self.statements.try_lead, (self._lock_key,)).fetchone()
        return bool(row and row[0])

    def horizon_bounds(self) -> tuple[int, int, int]:
        """(last position drawn, an xid assigned after, oldest running xid after that).

        Three statements, three transactions, in this order (see relay/horizon.py).
        """
        connection = self.connection
        last = connection.execute(self.statements.last_position).fetchone()
        xid = connection.execute(self.statements.new_xid).fetchone()
        xmin = connection.execute(self.statements.oldest_running_xid).fetchone()
        assert last is not None and xid is not None and xmin is not None
        return int(last[0]), int(xid[0]), int(xmin[0])

    def read(self, floor: int, limit: int) -> list[OutboxRow]:
        cursor = self.connection.cursor(binary=True)
        cursor.execute(self.statements.read, (floor, limit))
        return [OutboxRow(*row) for row in cursor.fetchall()]

    def finish(self, delivered: Sequence[str], rejected: Sequence[tuple[str, str]]) -> None:
        """Delete what the broker acknowledged; move what it refused to the dead letters.

        One transaction: a crash leaves either all of it or none of it (then the batch is
        published again, with the same event ids).
        """
        connection = self.connection
        with connection.transaction():
            for event_id, reason in rejected:
                connection.execute(self.statements.dead_letter, (reason, event_id))
            connection.execute(
                self.statements.delete, ([*delivered, *(event_id for event_id, _ in rejected)],)
            )

    def remove_delivered(self, event_ids: Sequence[uuid.UUID], offsets: Offsets) -> int:
        """Delete rows CDC delivered and store how far its records were read, atomically.

        Returns how many rows were still there.
        """
        connection = self.connection
        with connection.transaction():
            removed = 0
            if event_ids:
                removed = connection.execute(self.statements.delete, (list(event_ids),)).rowcount
            if offsets:
                document = json.dumps(
                    [
                        {"topic": topic, "partition": partition, "next_offset": offset}
                        for (topic, partition), offset in offsets.items()
                    ]
                )
                connection.execute(self.statements.store_offsets, (document,))
        return removed

    def cdc_offsets(self) -> Offsets:
        rows = self.connection.execute(self.statements.load_offsets).fetchall()
        return {(topic, partition): offset for topic, partition, offset in rows}

    def backlog(self) -> Backlog:
        connection = self.connection
        rows, age = connection.execute(self.statements.backlog).fetchone() or (0, 0.0)
        dead = connection.execute(self.statements.dead_letter_count).fetchone()
        return Backlog(
            rows=int(rows), oldest_age_seconds=float(age), dead_letters=int(dead[0]) if dead else 0
        )
