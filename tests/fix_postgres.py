"""A private Postgres of the suite's own, and throw-away databases.

The suite runs its own cluster of the local stack (``.stack/test``, on a free loopback
port), apart from the one ``outbox stack up`` runs for development, and stops it at the end.
Tests only ever use databases they create themselves, named ``outbox_test_*``.

Run by several pytest-xdist workers (``make test``), each worker has stacks of its own under
``.stack/<worker>/`` (:data:`STACK_ROOT`).
"""

from __future__ import annotations

import os
import random
import shutil
import socket
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

import outbox_migrations
from outbox_stack import PostgresCluster, StackSettings


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


ROOT = Path(__file__).resolve().parents[1]
STACK_ROOT = ROOT / ".stack" / os.environ.get("PYTEST_XDIST_WORKER", "")
"""Where this test process keeps its stacks: ``.stack``, or ``.stack/gw0`` for the first of
the pytest-xdist workers ``make test`` runs (one worker's services never meet another's)."""


_WORKER = int("0" + "".join(filter(str.isdigit, os.environ.get("PYTEST_XDIST_WORKER", ""))))
PORTS = range(23_000 + 1_750 * (_WORKER % 4), 23_000 + 1_750 * (_WORKER % 4 + 1))
"""This test process's ports: below Linux's ephemeral range (32768 and up), where any
client's connection may take a port between the moment it is found free and the moment a
service binds it, and apart from the other workers' (and the object store's 20000-22764
and 30000-32764)."""


_given: set[int] = set()


def all_free(ports: list[int]) -> bool:
    """Whether every one of ``ports`` can be bound on loopback now."""
    probes: list[socket.socket] = []
    try:
        for port in ports:
            probes.append(socket.socket())
            probes[-1].bind(("127.0.0.1", port))
        return True
    except OSError:
        return False
    finally:
        for probe in probes:
            probe.close()


def free_port() -> int:
    """A loopback port of :data:`PORTS` free now, and not given before by this process (a
    service is often started seconds after its port was drawn, beside the next draw)."""
    if len(_given) > len(PORTS) // 2:
        _given.clear()
    for _ in range(500):
        port = random.choice(PORTS)
        if port in _given or not all_free([port]):
            continue
        _given.add(port)
        return port
    raise RuntimeError(f"no free port in {PORTS.start}-{PORTS.stop - 1}")


@pytest.fixture(scope="session")
def cluster() -> Iterator[PostgresCluster]:
    cluster = PostgresCluster(StackSettings(dir=STACK_ROOT / "test", postgres_port=free_port()))
    cluster.down()  # left running by an interrupted run, perhaps on another port
    cluster.up()
    yield cluster
    cluster.down()


@pytest.fixture
def own_cluster() -> Iterator[PostgresCluster]:
    """A second cluster of its own for one test, in a temporary folder, on a free port."""
    folder = Path(tempfile.mkdtemp(prefix="outbox-stack-"))
    folder.chmod(0o755)  # the postgres user must reach it when we run as root
    cluster = PostgresCluster(StackSettings(dir=folder, postgres_port=free_port()))
    yield cluster
    cluster.destroy()
    shutil.rmtree(folder, ignore_errors=True)


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
        outbox_migrations.upgrade(connection)
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
    # pre-ping: a test restarts PostgreSQL (test_cdc_faults); pooled connections die with it.
    engine = sa.create_engine(database.url, pool_size=10, pool_pre_ping=True)
    yield engine
    engine.dispose()


@pytest.fixture
async def async_engine(database: ScratchDatabase) -> AsyncIterator[AsyncEngine]:
    engine = create_async_engine(database.url)
    yield engine
    await engine.dispose()
