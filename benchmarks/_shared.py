"""What the benchmark scripts share: the stack without Connect, a fresh migrated database,
percentiles, what the figures ran on (versions from the pinned Java artifacts), and figures
printed side by side."""

from __future__ import annotations

import socket
import time
import uuid
from collections.abc import Callable

import psycopg
import sqlalchemy as sa

import outbox_migrations
from outbox import Event, Outbox
from outbox_stack.artifacts import java_versions
from outbox_stack.local import LocalStack

__all__ = [
    "broker_name",
    "connect_name",
    "free_port",
    "fresh_database",
    "paced_writes",
    "percentile",
    "postgres_and_broker",
    "side_by_side",
    "stack_names",
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


def delete_topics(bootstrap: str, topics: list[str]) -> None:
    """Delete the outbox topics a run made (those of ``topics`` that exist): left on the
    stack's broker, they would be read by the next lake that ingests every outbox topic
    (``outbox demo``'s, say)."""
    from kafka.admin import KafkaAdminClient

    if not topics:
        return
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        existing = set(admin.list_topics())
        if made := [topic for topic in topics if topic in existing]:
            admin.delete_topics(made)
    finally:
        admin.close()


def free_port() -> int:
    """A loopback port free now (the operating system's choice)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


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


def broker_name(stack: LocalStack) -> str:
    """The broker the figures ran on: the stack's Apache Kafka (its version from the pinned
    Java artifacts, ``outbox_stack/java/pom.xml``), or the external cluster named by
    ``OUTBOX_KAFKA_BOOTSTRAP_SERVERS`` (its version is not known here, and its address is
    left out of results that may be published)."""
    if stack.broker is None:
        return "external Kafka (OUTBOX_KAFKA_BOOTSTRAP_SERVERS)"
    return f"Apache Kafka {java_versions()['kafka.version']} (KRaft, one node, loopback)"


def connect_name() -> str:
    """Kafka Connect and Debezium as the stack runs them (``connect-runtime`` is pinned to
    the broker's Kafka version, Debezium to its own), from the pinned Java artifacts."""
    versions = java_versions()
    return f"Kafka Connect {versions['kafka.version']}, Debezium {versions['debezium.version']}"


def stack_names(stack: LocalStack, *, connect: bool) -> str:
    """What a result file records under ``stack``: the broker, and Connect when it was used."""
    return f"{broker_name(stack)}; {connect_name()}" if connect else broker_name(stack)


def side_by_side(title: str, columns: dict[str, dict[str, float]], digits: int = 0) -> None:
    """Print figures with one column per name (rates, processes), one row per figure."""
    names = list(columns)
    rows = list(dict.fromkeys(row for column in columns.values() for row in column))
    width = max([len(title), *map(len, rows)])
    print(f"{title:<{width}} " + " ".join(f"{name:>10}" for name in names))
    for row in rows:
        cells = [
            f"{columns[name][row]:>10,.{digits}f}" if row in columns[name] else f"{'-':>10}"
            for name in names
        ]
        print(f"{row:<{width}} " + " ".join(cells))
