"""What the benchmark scripts share: the stack without Connect, a fresh migrated database,
percentiles."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable

import psycopg
import sqlalchemy as sa

import outbox_migrations
from outbox import Event, Outbox
from outbox_stack.local import LocalStack

__all__ = [
    "engines_side_by_side",
    "fresh_database",
    "paced_writes",
    "percentile",
    "postgres_and_broker",
]


def postgres_and_broker() -> LocalStack:
    """The native stack's PostgreSQL and broker, started if needed (Connect is not needed)."""
    stack = LocalStack()
    stack.postgres.up()
    if stack.broker is not None:
        stack.broker.up()
    return stack


def fresh_database(stack: LocalStack, name: str) -> str:
    """Drop and create ``name``, apply the outbox migrations; its SQLAlchemy URL."""
    cluster = stack.postgres
    cluster.drop_database(name)
    cluster.ensure_database(name)
    url = cluster.url(name)
    engine = sa.create_engine(url)
    with engine.begin() as connection:
        outbox_migrations.upgrade(connection)
    engine.dispose()
    return url


def percentile(values: list[float], fraction: float) -> float:
    return values[min(len(values) - 1, int(fraction * len(values)))]


def paced_writes(
    conninfo: str,
    aggregate_type: str,
    committed: dict[uuid.UUID, float],
    *,
    events_per_tick: int,
    seconds: float,
    tick_seconds: float = 0.010,
    every_100_ticks: Callable[[], None] | None = None,
) -> None:
    """A steady load: ``events_per_tick`` events in one transaction every ``tick_seconds``
    for ``seconds`` (50 aggregates). ``committed`` gets each event's wall-clock commit time
    as soon as it commits (a reader may watch it meanwhile)."""
    outbox = Outbox()
    with psycopg.connect(conninfo) as connection:
        tick = time.monotonic()
        end = tick + seconds
        number = 0
        while tick < end:
            events = [
                Event(aggregate_type, str((number + i) % 50), "Tick", {"n": number + i})
                for i in range(events_per_tick)
            ]
            with connection.transaction():
                outbox.publish_many(connection, events)
            now = time.time()
            for event in events:
                committed[event.event_id] = now
            number += events_per_tick
            tick += tick_seconds
            time.sleep(max(0.0, tick - time.monotonic()))  # the pace, not a condition to await
            if every_100_ticks is not None and number % (100 * events_per_tick) == 0:
                every_100_ticks()


def engines_side_by_side(
    figures: dict[str, dict[str, float]], label: str
) -> dict[str, dict[str, float]]:
    """Print the broker engines' figures side by side (when both ran); the rounded figures
    for the JSON results."""
    if len(figures) > 1:
        memory, s3 = figures["memory"], figures["s3"]
        print(f"{label:<34} {'memory':>9} {'s3':>9} {'s3/memory':>10}")
        for name in memory:
            ratio = s3[name] / memory[name]
            print(f"{name:<34} {memory[name]:>9,.0f} {s3[name]:>9,.0f} {ratio:>10.2f}")
    return {
        engine: {name: round(value, 1) for name, value in found.items()}
        for engine, found in figures.items()
    }
