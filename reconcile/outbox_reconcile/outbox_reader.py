"""Reads the outbox's present rows and its dead letters (psycopg, read-only, streamed).

Both are read in one read-only, repeatable-read transaction through server-side cursors, so
memory does not grow with the backlog and the two lists are of the same moment. Rows are
read *before* Kafka: a row delivered meanwhile is then found on Kafka, never reported stuck.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import psycopg

from outbox.core.tables import OutboxTables
from outbox_reconcile.evidence import Evidence
from outbox_reconcile.records import Window
from outbox_reconcile.statements import ReconcileStatements
from outbox_relay.database import libpq_conninfo

__all__ = ["read_outbox"]

_CHUNK = 5_000


def _streamed(
    connection: psycopg.Connection[Any], name: str, sql: str, window: Window
) -> Iterator[tuple[Any, ...]]:
    with connection.cursor(name=name) as cursor:
        cursor.itersize = _CHUNK
        cursor.execute(sql)  # names from OutboxTables: validated and quoted
        for row in cursor:
            if window.holds(row[0]):
                yield row


def read_outbox(
    database_url: str,
    tables: OutboxTables,
    evidence: Evidence,
    window: Window,
    advance: Callable[[int], None] = lambda _: None,
) -> dict[str, int]:
    """Stream the outbox rows and dead letters in ``window`` into ``evidence``; return the
    WAL each logical replication slot of the database retains (bytes)."""
    statements = ReconcileStatements(tables)
    with psycopg.connect(libpq_conninfo(database_url)) as connection:
        connection.read_only = True
        connection.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        with connection.transaction():
            evidence.add_outbox_rows(
                _counted(
                    _streamed(
                        connection,
                        "reconcile_outbox",
                        statements.outbox_rows,
                        window,
                    ),
                    advance,
                )
            )
            evidence.add_dead_letters(
                _counted(
                    _streamed(
                        connection,
                        "reconcile_dead_letters",
                        statements.dead_letters,
                        window,
                    ),
                    advance,
                )
            )
            slots = connection.execute(statements.slots).fetchall()
    return {str(name): int(retained) for name, retained in slots}


def _counted(rows: Iterator[Any], advance: Callable[[int], None]) -> Iterator[Any]:
    for count, row in enumerate(rows, 1):
        if count % 1000 == 0:
            advance(1000)
        yield row
