"""What the benchmark scripts share: the stack without Connect, a fresh migrated database,
percentiles."""

from __future__ import annotations

import sqlalchemy as sa

import migrations
from stack.local import LocalStack

__all__ = ["fresh_database", "percentile", "postgres_and_broker"]


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
        migrations.upgrade(connection)
    engine.dispose()
    return url


def percentile(values: list[float], fraction: float) -> float:
    return values[min(len(values) - 1, int(fraction * len(values)))]
