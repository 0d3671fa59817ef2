"""What the chaos writers' transactions do, once for every driver: generators of steps that
do no I/O (as the SDK's own protocol does); the sync and async drivers of psycopg and
SQLAlchemy only run the steps (:mod:`chaos.writers`).

Two kinds of transaction:

- **orders** (own aggregates): a business row inserted, and its events (``OrderPlaced`` and
  a few ``OrderLineAdded``) published for one of the writer's own orders;
- **accounts** (aggregates every accounts writer shares): the events are built first (their
  UUIDv7 ids take the time of building), then the business rows are locked
  (``SELECT ... FOR UPDATE``, in id order) and their ``version`` raised, then the events are
  published. A writer that waited for the lock commits after one that built its events later:
  event-id order is not commit order, and the lake must keep the position's.

Each transaction reads its events' positions back before it ends (the ground truth of
per-aggregate commit order), and some roll back on purpose after publishing.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any

from chaos.truth import Written
from outbox import Event
from outbox.core.tables import OutboxTables

__all__ = [
    "ACCOUNT",
    "ORDER",
    "Ending",
    "Plan",
    "Publish",
    "Query",
    "Transaction",
    "account_transaction",
    "order_transaction",
    "schema_statements",
]

ORDER = "order"
ACCOUNT = "account"
ORDERS_PER_WRITER = 40
ACCOUNTS = 16


@dataclass(frozen=True)
class Query:
    """A statement (psycopg's ``%(name)s`` parameters); the driver sends back its rows."""

    sql: str
    params: dict[str, Any]


@dataclass(frozen=True)
class Publish:
    """The events, published through the SDK on the transaction's connection or session."""

    events: list[Event]


@dataclass(frozen=True)
class Ending:
    """The events as written (positions and versions read back), and whether to commit."""

    written: list[Written]
    commit: bool


Plan = Generator[Query | Publish, list[tuple[Any, ...]], Ending]


@dataclass
class Transaction:
    """The events a transaction will write (known before its first statement: an aborted
    transaction's ids are recorded too) and its steps."""

    events: list[Event]
    steps: Plan

    def unwritten(self) -> list[Written]:
        """The events as known before anything was read back."""
        return [_written(event, None, None) for event in self.events]


def schema_statements() -> list[tuple[str, dict[str, Any]]]:
    """The business tables the writers write, and the shared accounts (with parameters)."""
    statements = [
        "CREATE SCHEMA IF NOT EXISTS chaos",
        "CREATE TABLE IF NOT EXISTS chaos.purchase (id uuid PRIMARY KEY, writer text NOT NULL, "
        "aggregate_id text NOT NULL, lines integer NOT NULL)",
        "CREATE TABLE IF NOT EXISTS chaos.account (id text PRIMARY KEY, "
        "version bigint NOT NULL DEFAULT 0)",
    ]
    accounts = (
        "INSERT INTO chaos.account (id) SELECT 'a' || n FROM generate_series(0, :last) AS n "
        "ON CONFLICT DO NOTHING"
    )
    return [(statement, {}) for statement in statements] + [(accounts, {"last": ACCOUNTS - 1})]


def _written(event: Event, position: int | None, version: int | None) -> Written:
    return Written(
        event_id=str(event.event_id),
        aggregate_type=event.aggregate_type,
        aggregate_id=event.aggregate_id,
        position=position,
        version=version,
    )


def _positions(tables: OutboxTables, events: list[Event]) -> Query:
    return Query(
        # The table name is a validated, quoted identifier (outbox.core.identifiers).
        f"SELECT id::text, position FROM {tables.qualified_outbox} "  # noqa: S608
        "WHERE id = ANY(%(ids)s)",
        {"ids": [event.event_id for event in events]},
    )


def order_transaction(
    rng: random.Random, writer: str, tables: OutboxTables, *, roll_back: bool
) -> Transaction:
    aggregate_id = f"{writer}-{rng.randrange(ORDERS_PER_WRITER)}"
    lines = rng.randint(0, 4)
    events = [Event(ORDER, aggregate_id, "OrderPlaced", {"writer": writer, "lines": lines})] + [
        Event(ORDER, aggregate_id, "OrderLineAdded", {"line": line, "sku": rng.randrange(1000)})
        for line in range(lines)
    ]

    def steps() -> Plan:
        yield Query(
            "INSERT INTO chaos.purchase (id, writer, aggregate_id, lines) "
            "VALUES (%(id)s, %(writer)s, %(aggregate_id)s, %(lines)s)",
            {"id": uuid.uuid4(), "writer": writer, "aggregate_id": aggregate_id, "lines": lines},
        )
        yield Publish(events)
        positions: dict[str, int] = dict((yield _positions(tables, events)))
        written = [_written(e, positions[str(e.event_id)], None) for e in events]
        return Ending(written, commit=not roll_back)

    return Transaction(events, steps())


def account_transaction(
    rng: random.Random, writer: str, tables: OutboxTables, *, roll_back: bool
) -> Transaction:
    chosen = sorted(f"a{n}" for n in rng.sample(range(ACCOUNTS), k=rng.choice((1, 1, 2))))
    # Built before the rows are locked: the ids' time is not the commit order.
    events = [
        Event(
            ACCOUNT,
            account,
            rng.choice(("Credited", "Debited")),
            {"writer": writer, "amount": rng.randint(1, 500)},
        )
        for account in chosen
        for _ in range(rng.randint(1, 3))
    ]

    def steps() -> Plan:
        yield Query(
            "SELECT id FROM chaos.account WHERE id = ANY(%(ids)s) ORDER BY id FOR UPDATE",
            {"ids": chosen},
        )
        versions: dict[str, int] = dict(
            (
                yield Query(
                    "UPDATE chaos.account SET version = version + 1 WHERE id = ANY(%(ids)s) "
                    "RETURNING id, version",
                    {"ids": chosen},
                )
            )
        )
        yield Publish(events)
        positions: dict[str, int] = dict((yield _positions(tables, events)))
        written = [
            _written(e, positions[str(e.event_id)], int(versions[e.aggregate_id])) for e in events
        ]
        return Ending(written, commit=not roll_back)

    return Transaction(events, steps())
