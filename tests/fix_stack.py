"""The broker and Kafka Connect of the suite's own local stack: Apache Kafka (one KRaft node)
and a Connect worker with Debezium, as ``outbox stack up`` starts them.

- ``kafka_services`` (session, shared by the CDC, relay and lake tests): never restarted.
- ``durable_services`` (module): a broker and a Connect worker of their own, in a stack folder
  of their own, for the tests that kill, pause or restart the broker (the session's services
  are untouched); removed at the end.
- The conformance suite (tests/broker/) runs on a broker of its own, or on the one named by
  ``OUTBOX_KAFKA_BOOTSTRAP_SERVERS``.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from outbox.core.errors import ConnectError
from outbox.settings import KafkaSettings
from outbox_connect.client import ConnectClient
from outbox_connect.open_transactions import (
    IDLE_SECONDS,
    OpenTransaction,
    open_transactions,
    unblock,
)
from outbox_stack import PostgresCluster
from outbox_stack.broker import KafkaBroker
from outbox_stack.connect import OFFSETS_TOPIC, ConnectWorker
from outbox_stack.settings import StackSettings
from tests.fix_postgres import ROOT, free_port


@dataclass(frozen=True)
class KafkaServices:
    settings: StackSettings
    cluster: PostgresCluster
    broker: KafkaBroker
    connect: ConnectWorker

    @property
    def cdc_password(self) -> str:
        """The password every CDC role of the suite gets; the worker knows it (env)."""
        return self.cluster.cdc_password()

    def start_connect(self) -> None:
        self.connect.up(secrets={"OUTBOX_CONNECT_DATABASE_PASSWORD": self.cdc_password})

    def wait_connector_running(self, name: str, *, timeout: float) -> None:
        """Wait for connector ``name`` to run; if it does not, fail quoting what Connect and
        the broker logged (their folders are removed with the fixture)."""
        try:
            ConnectClient(self.connect.rest_url).wait_running(name, timeout=timeout)
        except ConnectError as error:
            held = "\n".join(t.describe() for t in self.offsets_topic_transactions())
            raise AssertionError(f"{error}\n{held}\n{self.logged_trouble()}") from None

    offsets_topic = OFFSETS_TOPIC

    @property
    def kafka(self) -> KafkaSettings:
        return KafkaSettings(bootstrap_servers=self.bootstrap_servers)

    def offsets_topic_transactions(self) -> list[OpenTransaction]:
        """Transactions open on the worker's offsets topic (which hold its start-up)."""
        return open_transactions(self.kafka, self.offsets_topic)

    def unblock_connect(self) -> list[OpenTransaction]:
        """``outbox connect unblock``'s remedy: the hanging transactions it aborted."""
        aborted, _ = unblock(self.kafka, self.offsets_topic, idle_seconds=IDLE_SECONDS)
        return aborted

    def logged_trouble(self, lines: int = 60) -> str:
        """The last warnings and errors of Connect's and the broker's logs."""
        quoted = []
        for process in (self.connect.process, self.broker.process):
            found = [
                line[:400]
                for line in process.tail(20000)
                if " WARN " in line or " ERROR " in line or "Exception" in line
            ]
            quoted.append(f"--- {process.log_file}:\n" + "\n".join(found[-lines:]))
        return "\n".join(quoted)

    @property
    def bootstrap_servers(self) -> str:
        return self.broker.bootstrap_servers


def stack_settings(root: Path, postgres_port: int) -> StackSettings:
    return StackSettings(
        dir=root,
        postgres_port=postgres_port,
        broker_port=free_port(),
        broker_controller_port=free_port(),
        connect_port=free_port(),
        downloads=ROOT / ".cache" / "stack",
    )


def started_services(cluster: PostgresCluster, settings: StackSettings) -> KafkaServices:
    broker = KafkaBroker(settings)
    connect = ConnectWorker(settings, bootstrap_servers=broker.bootstrap_servers)
    connect.down()  # left running by an interrupted run
    broker.down()
    # A fresh broker for each run: the last run's topics and Connect's configs (connectors of
    # databases dropped since) would come back from its durable data folder.
    shutil.rmtree(broker.home, ignore_errors=True)
    shutil.rmtree(connect.home, ignore_errors=True)
    broker.up()
    return KafkaServices(settings, cluster, broker, connect)


@pytest.fixture(scope="session")
def kafka_services(cluster: PostgresCluster) -> Iterator[KafkaServices]:
    settings = stack_settings(cluster.settings.dir, cluster.port)
    services = started_services(cluster, settings)
    try:
        services.start_connect()
        yield services
    finally:
        services.connect.down()
        services.broker.down()


@pytest.fixture(scope="module")
def durable_services(cluster: PostgresCluster) -> Iterator[KafkaServices]:
    """A broker and a Connect worker of their own, in a stack folder of their own (so the
    session's services are untouched), for tests that kill or pause them; removed at the end."""
    root = cluster.settings.dir.parent / "durable"
    settings = stack_settings(root, cluster.port)
    services = started_services(cluster, settings)
    try:
        services.start_connect()
        yield services
    finally:
        services.connect.down()
        services.broker.down()
        for home in (services.broker.home, services.connect.home):
            shutil.rmtree(home, ignore_errors=True)
