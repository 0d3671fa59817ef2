"""The broker and Kafka Connect of the suite's own local stack.

Which storage engine, and why:
- ``kafka_services`` (session, shared by the CDC, relay and lake tests): Tansu **in memory**,
  unless ``OUTBOX_TEST_BROKER_STORAGE=s3``. Those tests never restart the broker, and in
  memory a record produced on its own is acknowledged in about 1.1 ms instead of 7.3 ms, and
  CDC's latency is several times lower, on a 2-core machine the suite shares.
- ``durable_services`` (one module, tests/integration/test_stack_durable.py): Tansu on
  ``s3://`` over the object store, with a Connect worker of its own, for the tests that kill
  the broker, the store or both: only a durable broker can be killed and still hold the data.
- The conformance suite (tests/broker/) runs on both engines, or on the broker named by
  ``OUTBOX_KAFKA_BOOTSTRAP_SERVERS``.
"""

from __future__ import annotations

import os
import random
import shutil
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import pytest

from outbox_stack import PostgresCluster
from outbox_stack.broker import TansuBroker
from outbox_stack.connect import ConnectWorker
from outbox_stack.settings import StackSettings
from tests.fix_postgres import ROOT, free_port

Storage = Literal["s3", "memory"]


@dataclass(frozen=True)
class KafkaServices:
    settings: StackSettings
    cluster: PostgresCluster
    broker: TansuBroker
    connect: ConnectWorker

    @property
    def cdc_password(self) -> str:
        """The password every CDC role of the suite gets; the worker knows it (env)."""
        return self.cluster.cdc_password()

    def start_connect(self) -> None:
        self.connect.up(secrets={"OUTBOX_CONNECT_DATABASE_PASSWORD": self.cdc_password})

    @property
    def bootstrap_servers(self) -> str:
        return self.broker.bootstrap_servers


def free_object_store_port() -> int:
    """A base port for the object store: it and the next four free, and each plus 10000; all
    below Linux's ephemeral range (32768 and up), where a client's connection may take one."""
    for _ in range(200):
        base = random.randint(20000, 22760)
        if _all_free([base + i + grpc for i in range(5) for grpc in (0, 10000)]):
            return base
    raise RuntimeError("no free block of ports for the object store")


def _all_free(ports: list[int]) -> bool:
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


def stack_settings(root: Path, postgres_port: int, storage: Storage) -> StackSettings:
    return StackSettings(
        dir=root,
        postgres_port=postgres_port,
        broker_port=free_port(),
        broker_storage=storage,
        object_store_port=free_object_store_port(),
        connect_port=free_port(),
        downloads=ROOT / ".cache" / "stack",
    )


def session_storage() -> Storage:
    chosen = os.environ.get("OUTBOX_TEST_BROKER_STORAGE", "memory")
    if chosen not in ("s3", "memory"):
        raise ValueError(f"OUTBOX_TEST_BROKER_STORAGE={chosen!r}: use 's3' or 'memory'")
    return chosen  # type: ignore[return-value]


def started_services(cluster: PostgresCluster, settings: StackSettings) -> KafkaServices:
    broker = TansuBroker(settings)
    connect = ConnectWorker(settings, bootstrap_servers=broker.bootstrap_servers)
    connect.down()  # left running by an interrupted run
    broker.down()
    broker.up()
    return KafkaServices(settings, cluster, broker, connect)


@pytest.fixture(scope="session")
def kafka_services(cluster: PostgresCluster) -> Iterator[KafkaServices]:
    settings = stack_settings(cluster.settings.dir, cluster.port, session_storage())
    services = started_services(cluster, settings)
    try:
        services.start_connect()
        yield services
    finally:
        services.connect.down()
        services.broker.down()


@pytest.fixture(scope="module")
def durable_services(cluster: PostgresCluster) -> Iterator[KafkaServices]:
    """A broker on ``s3://`` over its object store and a Connect worker on it, in a stack
    folder of their own (so the session's services are untouched); removed at the end."""
    root = cluster.settings.dir.parent / "durable"
    settings = stack_settings(root, cluster.port, "s3")
    services = started_services(cluster, settings)
    try:
        services.start_connect()
        yield services
    finally:
        services.connect.down()
        services.broker.down()
        for home in (services.broker.process.home, services.connect.process.home):
            shutil.rmtree(home, ignore_errors=True)
        if services.broker.object_store is not None:
            shutil.rmtree(services.broker.object_store.process.home, ignore_errors=True)
