"""The private Postgres of the local stack, and a throw-away database per test session.

The cluster is started if it is not running (and stopped again at the end in that case).
Tests only ever use databases they create themselves, named ``outbox_test_*``.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

import psycopg
import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

import migrations
from stack import PostgresCluster, StackSettings


@dataclass(frozen=True)
class ScratchDatabase:
    cluster: PostgresCluster
    name: str

    @property
    def url(self) -> str:
        return self.cluster.url(self.name)

    @property
    def conninfo(self) -> str:
        return self.cluster.conninfo(self.name)

    def connect(self, **kwargs: object) -> psycopg.Connection:
        return psycopg.connect(self.conninfo, **kwargs)  # type: ignore[arg-type]


@pytest.fixture(scope="session")
def cluster() -> Iterator[PostgresCluster]:
    cluster = PostgresCluster(StackSettings())
    started_here = not cluster.is_running()
    cluster.up()
    yield cluster
    if started_here:
        cluster.down()


def _create_database(cluster: PostgresCluster, purpose: str) -> ScratchDatabase:
    name = f"outbox_test_{purpose}_{uuid.uuid4().hex[:10]}"
    cluster.ensure_database(name)
    return ScratchDatabase(cluster, name)


@pytest.fixture(scope="session")
def database(cluster: PostgresCluster) -> Iterator[ScratchDatabase]:
    """A database with the outbox migrations applied, shared by the session's tests."""
    db = _create_database(cluster, "sdk")
    engine = sa.create_engine(db.url)
    with engine.begin() as connection:
        migrations.upgrade(connection)
    engine.dispose()
    yield db
    cluster.drop_database(db.name)


@pytest.fixture
def empty_database(cluster: PostgresCluster) -> Iterator[ScratchDatabase]:
    """A new, empty database for one test."""
    db = _create_database(cluster, "empty")
    yield db
    cluster.drop_database(db.name)


@pytest.fixture(scope="session")
def engine(database: ScratchDatabase) -> Iterator[sa.Engine]:
    engine = sa.create_engine(database.url, pool_size=10)
    yield engine
    engine.dispose()


@pytest.fixture
async def async_engine(database: ScratchDatabase) -> AsyncIterator[AsyncEngine]:
    engine = create_async_engine(database.url)
    yield engine
    await engine.dispose()
