"""The broker and Kafka Connect of the suite's own local stack, started once per session."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from stack import PostgresCluster
from stack.broker import TansuBroker
from stack.connect import ConnectWorker
from stack.settings import StackSettings
from tests.fix_postgres import ROOT, free_port


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


@pytest.fixture(scope="session")
def kafka_services(cluster: PostgresCluster) -> Iterator[KafkaServices]:
    settings = StackSettings(
        dir=cluster.settings.dir,
        postgres_port=cluster.port,
        broker_port=free_port(),
        connect_port=free_port(),
        downloads=ROOT / ".cache" / "stack",
    )
    broker = TansuBroker(settings)
    connect = ConnectWorker(settings, bootstrap_servers=broker.bootstrap_servers)
    connect.down()  # left running by an interrupted run
    broker.down()
    broker.up()
    services = KafkaServices(settings, cluster, broker, connect)
    try:
        services.start_connect()
        yield services
    finally:
        connect.down()
        broker.down()
