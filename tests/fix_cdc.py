"""The CDC path on the suite's own stack: a migrated database, a CDC role, the connector."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import pytest
import sqlalchemy as sa

import outbox_migrations
from outbox import OutboxSettings
from outbox_connect import ConnectClient, ConnectorSettings, render_connector_config
from tests.fix_postgres import ScratchDatabase
from tests.fix_stack import KafkaServices
from tests.kafka_read import read_count, read_until


@dataclass(frozen=True)
class CdcPath:
    database: ScratchDatabase
    kafka: KafkaServices
    connector: ConnectorSettings
    client: ConnectClient

    def consume(self, topic: str, count: int, *, timeout: float = 60) -> list[object]:
        """Read ``topic`` from the start until ``count`` records came or ``timeout`` passed."""
        return read_count(self.kafka.bootstrap_servers, topic, count, timeout=timeout)

    def consume_until(
        self, topic: str, done: Callable[[list[object]], bool], *, timeout: float = 60
    ) -> list[object]:
        """Read ``topic`` from the start, with one consumer, until ``done(records)``."""
        return read_until(self.kafka.bootstrap_servers, topic, done, timeout=timeout)


@contextmanager
def cdc_path_for(
    kafka_services: KafkaServices, db: ScratchDatabase, *, topic_prefix: str | None = None
) -> Iterator[CdcPath]:
    """A CDC role and a running connector (heartbeat every second, PostgreSQL's certificate
    verified) for a migrated ``db``; the connector, its slot and the role are removed at exit.
    ``topic_prefix``: the connector's (a fresh ``outbox<suffix>`` by default)."""
    suffix = uuid.uuid4().hex[:8]
    connector = ConnectorSettings(
        url=kafka_services.connect.rest_url,
        name=f"outbox-test-{suffix}",
        database_port=db.cluster.port,
        database_name=db.name,
        database_user=f"cdc_{suffix}",
        slot_name=f"slot_{suffix}",
        topic_prefix=topic_prefix or f"outbox{suffix}",
        heartbeat_interval_ms=1000,
        # As `outbox stack env` sets it: the connector verifies PostgreSQL's certificate.
        database_sslmode="verify-full",
        database_sslrootcert=str(db.cluster.ca_file),
    )
    engine = sa.create_engine(db.url)
    with engine.begin() as connection:
        outbox_migrations.create_cdc_role(
            connection, connector.database_user, kafka_services.cdc_password
        )
    client = ConnectClient(connector.url)
    client.apply(connector.name, render_connector_config(connector, OutboxSettings()))
    client.wait_running(connector.name, timeout=120)
    try:
        yield CdcPath(db, kafka_services, connector, client)
    finally:
        client.delete(connector.name)
        engine.dispose()  # its pooled connection may have died with a PostgreSQL restart
        with engine.begin() as connection:
            deadline = time.monotonic() + 30
            while (
                connection.execute(
                    sa.text("SELECT active FROM pg_replication_slots WHERE slot_name = :s"),
                    {"s": connector.slot_name},
                ).scalar()
                and time.monotonic() < deadline
            ):
                time.sleep(0.2)
            connection.execute(
                sa.text(
                    "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                    "WHERE slot_name = :s"
                ),
                {"s": connector.slot_name},
            )
            connection.execute(sa.text(f'DROP OWNED BY "{connector.database_user}"'))
            connection.execute(sa.text(f'DROP ROLE IF EXISTS "{connector.database_user}"'))
        engine.dispose()


@pytest.fixture(scope="session")
def cdc(kafka_services: KafkaServices) -> Iterator[CdcPath]:
    db = ScratchDatabase(kafka_services.cluster, f"outbox_test_cdc_{uuid.uuid4().hex[:8]}")
    db.cluster.ensure_database(db.name)
    engine = sa.create_engine(db.url)
    with engine.begin() as connection:
        outbox_migrations.upgrade(connection)
    engine.dispose()
    with cdc_path_for(kafka_services, db) as path:
        yield path
    db.cluster.drop_database(db.name)
