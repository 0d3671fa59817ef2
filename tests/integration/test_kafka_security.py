"""Every client of ours on a secured Apache Kafka (tests/fix_secure_kafka.py): SASL_SSL with
SCRAM and PLAIN, mutual TLS, ACLs on. Each logs in as its own principal and does its job; a
principal outside its ACLs is refused with an error of ours naming what; a wrong password, an
unknown user or an untrusted certificate is said as such within seconds."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

import outbox_migrations
from outbox import Event, Outbox, OutboxSettings
from outbox.consumer import IdempotentConsumer
from outbox.core.contract import event_id_of, topic_for
from outbox.core.errors import BrokerAuthenticationError, BrokerAuthorizationError
from outbox.kafka_clients import kafka_errors
from outbox.kafka_options import client_options
from outbox.kafka_reading import KafkaReader, ReaderRole
from outbox.settings import KafkaSettings
from outbox_reconcile.evidence import Evidence
from outbox_reconcile.kafka_reader import read_kafka
from outbox_reconcile.records import Window
from outbox_relay.cdc_watch import CdcWatch
from outbox_relay.producer import ContractProducer
from outbox_relay.service import Relay
from outbox_relay.settings import RelaySettings
from outbox_stack import PostgresCluster
from tests.cli import run_outbox
from tests.fix_cdc import cdc_path_for
from tests.fix_postgres import ScratchDatabase
from tests.fix_relay import FAST, wait_until
from tests.fix_secure_kafka import (
    CDC_TOPIC_PREFIX,
    CONSUMER_GROUP,
    HEARTBEAT_TOPIC,
    SecureConnect,
    SecureKafka,
)
from tests.fix_stack import KafkaServices
from tests.kafka_read import read_until

ROLE = ReaderRole(client_id="outbox-security-tests", when_offsets_gone="earliest")
FAILS_WITHIN_SECONDS = 5.0


@pytest.fixture
def migrated(cluster: PostgresCluster) -> Iterator[ScratchDatabase]:
    database = ScratchDatabase(cluster, f"outbox_test_secure_{uuid.uuid4().hex[:8]}")
    cluster.ensure_database(database.name)
    engine = sa.create_engine(database.url)
    with engine.begin() as connection:
        outbox_migrations.upgrade(connection)
    engine.dispose()
    yield database
    cluster.drop_database(database.name)


def publish(database: ScratchDatabase, aggregate_type: str, count: int) -> list[str]:
    engine = sa.create_engine(database.url)
    ids = []
    with engine.begin() as connection:
        for number in range(count):
            event = Event(aggregate_type, str(number % 3), "Created", {"n": number})
            Outbox().publish(connection, event)
            ids.append(str(event.event_id))
    engine.dispose()
    return ids


def left(database: ScratchDatabase) -> int:
    with database.connect() as connection:
        row = connection.execute("SELECT count(*) FROM outbox.outbox").fetchone()
    return -1 if row is None else int(row[0])


def send_as_relay(secure_kafka: SecureKafka, migrated: ScratchDatabase, ids: list[str]) -> None:
    """The outbox's rows sent once by the relay's producer as the `relay` principal; all of
    ``ids`` delivered."""
    from outbox_relay.database import RelayDatabase

    producer = ContractProducer(secure_kafka.sasl("relay"), RelaySettings())
    try:
        database = RelayDatabase(migrated.url, OutboxSettings().tables, 10)
        database.connect()
        try:
            database.join()
            assert database.balance(), "this relay takes every slice"
            outcome = producer.publish(database.read(0, 100, []))
        finally:
            database.close()
        assert sorted(outcome.delivered) == sorted(ids), outcome
    finally:
        producer.close()


def refused(make: Callable[[], Any]) -> tuple[BrokerAuthenticationError, float]:
    """The login error ``make`` raises, and how long it took."""
    started = time.monotonic()
    with pytest.raises(BrokerAuthenticationError) as raised:
        made = make()
        made.close()
    return raised.value, time.monotonic() - started


def topic_names(settings: KafkaSettings, pattern: str = r"^outbox\.event\.") -> list[str]:
    reader = KafkaReader(settings, ROLE)
    try:
        return reader.topics(pattern)
    finally:
        reader.close()


# -- logging in ------------------------------------------------------------------------------


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN"])
def test_each_sasl_mechanism_logs_in_over_tls(secure_kafka: SecureKafka, mechanism: Any) -> None:
    topic_names(secure_kafka.sasl("reconcile", mechanism=mechanism))


def test_mutual_tls_logs_in_with_a_client_certificate(secure_kafka: SecureKafka) -> None:
    topic_names(secure_kafka.mtls("reconcile"))


@pytest.mark.parametrize("who", ["wrong password", "unknown user"])
def test_a_refused_login_says_so_within_seconds_for_every_client(
    secure_kafka: SecureKafka, who: str
) -> None:
    user = "reconcile" if who == "wrong password" else "nobody"
    settings = secure_kafka.sasl(user, password="not-the-password")
    makers: dict[str, Callable[[], Any]] = {
        "reader": lambda: KafkaReader(settings, ROLE),
        "relay's producer": lambda: ContractProducer(settings, RelaySettings()),
    }
    for client, make in makers.items():
        error, seconds = refused(make)
        assert error.reason == "credentials", (client, error)
        assert f"user {user!r}" in str(error) and "wrong password or unknown user" in str(error)
        assert "not-the-password" not in str(error)
        assert seconds < FAILS_WITHIN_SECONDS, (client, seconds)


def test_an_untrusted_broker_certificate_says_so_within_seconds(
    secure_kafka: SecureKafka,
) -> None:
    settings = secure_kafka.sasl("reconcile", cafile=secure_kafka.rogue.certfile)
    error, seconds = refused(lambda: KafkaReader(settings, ROLE))
    assert error.reason == "untrusted_certificate"
    assert "OUTBOX_KAFKA_SSL_CAFILE" in str(error) and "not trusted" in str(error)
    assert seconds < FAILS_WITHIN_SECONDS


def test_a_client_certificate_the_broker_does_not_trust_says_so_within_seconds(
    secure_kafka: SecureKafka,
) -> None:
    intruder = secure_kafka.rogue.issue("reconcile")  # the right name, the wrong authority
    settings = secure_kafka.mtls("reconcile", certificate=intruder)
    error, seconds = refused(lambda: KafkaReader(settings, ROLE))
    assert error.reason == "client_certificate"
    assert str(intruder.certfile) in str(error)
    assert seconds < FAILS_WITHIN_SECONDS
    without = KafkaSettings(
        bootstrap_servers=secure_kafka.mtls_servers,
        security_protocol="SSL",
        ssl_cafile=secure_kafka.authority.certfile,
    )
    error, seconds = refused(lambda: KafkaReader(without, ROLE))
    assert error.reason == "client_certificate" and "not set" in str(error)
    assert seconds < FAILS_WITHIN_SECONDS


def test_a_mechanism_the_listener_does_not_offer_says_so(secure_kafka: SecureKafka) -> None:
    settings = secure_kafka.sasl("reconcile").model_copy(
        update={"bootstrap_servers": secure_kafka.mtls_servers}
    )
    error, seconds = refused(lambda: KafkaReader(settings, ROLE))
    assert seconds < FAILS_WITHIN_SECONDS, error


# -- each component as its principal ------------------------------------------------------------


def test_a_relay_refused_by_kafka_logs_the_cause_as_an_error_and_keeps_its_rows(
    secure_kafka: SecureKafka, migrated: ScratchDatabase, caplog: pytest.LogCaptureFixture
) -> None:
    ids = publish(migrated, f"sec{uuid.uuid4().hex[:8]}", 2)
    relay = Relay(
        RelaySettings(**FAST),  # type: ignore[arg-type]
        database_url=migrated.url,
        kafka=secure_kafka.sasl("relay", password="not-the-password"),
        tables=OutboxSettings().tables,
    )
    refusals = relay.metrics.errors.labels("broker_security")
    stop = threading.Event()
    thread = threading.Thread(target=relay.run, args=(stop,))
    started = time.monotonic()
    with caplog.at_level(logging.ERROR, logger="outbox.relay"):
        thread.start()
        try:
            wait_until(lambda: refusals._value.get() >= 1, timeout=30, what="a refusal")
            seconds = time.monotonic() - started
        finally:
            stop.set()
            thread.join(timeout=60)
    assert not thread.is_alive()
    assert seconds < FAILS_WITHIN_SECONDS + 5  # the database and the lease come first
    assert "refused the login of user 'relay'" in caplog.text
    assert "not-the-password" not in caplog.text
    assert left(migrated) == len(ids)  # nothing lost: the rows wait for a login that works


def test_the_relay_publishes_and_others_read_each_as_its_principal(
    secure_kafka: SecureKafka, migrated: ScratchDatabase, tmp_path: Path
) -> None:
    aggregate_type = f"sec{uuid.uuid4().hex[:8]}"
    topic = topic_for(aggregate_type)
    ids = publish(migrated, aggregate_type, 12)
    relay = Relay(
        RelaySettings(**FAST),  # type: ignore[arg-type]
        database_url=migrated.url,
        kafka=secure_kafka.sasl("relay"),
        tables=OutboxSettings().tables,
    )
    stop = threading.Event()
    thread = threading.Thread(target=relay.run, args=(stop,))
    thread.start()
    try:
        wait_until(lambda: left(migrated) == 0, timeout=60, what="the relay published all")
    finally:
        stop.set()
        thread.join(timeout=60)
    assert not thread.is_alive()

    # Reconcile reads them (SCRAM), the lake's principal too (mutual TLS).
    records = read_until(
        secure_kafka.sasl("reconcile"), topic, lambda r: len(r) >= len(ids), timeout=30
    )  # type: ignore[arg-type]
    assert sorted(str(event_id_of(r.headers)) for r in records) == sorted(ids)
    assert topic in topic_names(secure_kafka.mtls("lake"))

    evidence = Evidence(tmp_path / "evidence.sqlite")
    try:
        read = read_kafka(
            secure_kafka.sasl("reconcile", mechanism="SCRAM-SHA-256"),
            f"^{topic}$",
            evidence,
            Window(),
            stall_seconds=20,
        )
    finally:
        evidence.close()
    assert read.records == len(ids) and read.partitions == 1

    # The relay's CDC watch (auto mode) reads them back as the relay.
    watch = CdcWatch(secure_kafka.sasl("relay"), heartbeat_topic=HEARTBEAT_TOPIC, offsets={})
    seen: set[str] = set()
    try:
        deadline = time.monotonic() + 30
        while len(seen & set(ids)) < len(ids) and time.monotonic() < deadline:
            seen |= {str(event_id) for event_id in watch.poll(0.5).event_ids}
    finally:
        watch.close()
    assert set(ids) <= seen

    # The CLI: trace finds the copy on Kafka as reconcile, the password from a file.
    password_file = tmp_path / "password"
    password_file.write_text(secure_kafka.passwords["reconcile"])
    env = {
        "OUTBOX_DATABASE_URL": migrated.url,
        "OUTBOX_KAFKA_BOOTSTRAP_SERVERS": secure_kafka.sasl_servers,
        "OUTBOX_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
        "OUTBOX_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
        "OUTBOX_KAFKA_SASL_USERNAME": "reconcile",
        "OUTBOX_KAFKA_SASL_PASSWORD_FILE": str(password_file),
        "OUTBOX_KAFKA_SSL_CAFILE": str(secure_kafka.authority.certfile),
        "OUTBOX_LAKE_ROOT": str(tmp_path / "lake"),
        "OUTBOX_LAKE_TOPIC_PATTERN": f"^{topic}$",
    }
    traced = run_outbox("trace", ids[0], "--scan-kafka", env=env, timeout=120)
    assert f"kafka:       topic {topic}, partition " in traced.stdout, traced.stdout + traced.stderr
    registered = run_outbox("db", "register-types", "--from-kafka", env=env, timeout=120)
    assert registered.returncode == 0, registered.stderr
    # Publishing registered the type already: the broker's topic was found and known.
    assert "0 type(s) registered" in registered.stdout, registered.stdout
    assert "0 already registered" not in registered.stdout, registered.stdout

    env["OUTBOX_KAFKA_SASL_USERNAME"] = "nobody"
    started = time.monotonic()
    failed = run_outbox("trace", ids[0], "--scan-kafka", env=env, timeout=120)
    assert failed.returncode == 2, failed.stdout + failed.stderr
    assert "refused the login of user 'nobody'" in failed.stderr
    assert secure_kafka.passwords["reconcile"] not in failed.stdout + failed.stderr
    assert time.monotonic() - started < 60  # a whole CLI process, imports included


def test_idempotent_consumer_consumes_over_mutual_tls_in_its_group(
    secure_kafka: SecureKafka, migrated: ScratchDatabase
) -> None:
    aggregate_type = f"sec{uuid.uuid4().hex[:8]}"
    ids = publish(migrated, aggregate_type, 5)
    send_as_relay(secure_kafka, migrated, ids)

    applied: list[str] = []
    engine = sa.create_engine(migrated.url)
    consumer: IdempotentConsumer[Any] = IdempotentConsumer(
        name="secure",
        group_id=CONSUMER_GROUP,
        kafka=secure_kafka.mtls("consumer"),
        begin=engine.begin,
        handler=lambda _connection, event: applied.append(str(event.event_id)),
        topics=[topic_for(aggregate_type)],
        consumer_options={"session_timeout_ms": 6000, "heartbeat_interval_ms": 1000},
    )
    try:
        deadline = time.monotonic() + 60
        while len(applied) < len(ids) and time.monotonic() < deadline:
            consumer.poll_once(timeout_seconds=0.5)
    finally:
        consumer.close()
        engine.dispose()
    assert sorted(applied) == sorted(ids)


@pytest.mark.timeout(600)
def test_the_lake_job_ingests_as_its_principal_with_spark_kafka_source(
    secure_kafka: SecureKafka, migrated: ScratchDatabase, tmp_path: Path
) -> None:
    """`outbox lake ingest` (Spark's Kafka source on the executors, our metadata reads on the
    driver) logs in as `lake` (SCRAM over TLS, the password from a file): every event lands
    once; a wrong password stops it at the start with the reason, not a Spark retry loop."""
    from deltalake import DeltaTable

    aggregate_type = f"sec{uuid.uuid4().hex[:8]}"
    ids = publish(migrated, aggregate_type, 9)
    send_as_relay(secure_kafka, migrated, ids)

    password_file = tmp_path / "lake-password"
    password_file.write_text(secure_kafka.passwords["lake"])
    lake = tmp_path / "lake"
    env = {
        "OUTBOX_KAFKA_BOOTSTRAP_SERVERS": secure_kafka.sasl_servers,
        "OUTBOX_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
        "OUTBOX_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
        "OUTBOX_KAFKA_SASL_USERNAME": "lake",
        "OUTBOX_KAFKA_SASL_PASSWORD_FILE": str(password_file),
        "OUTBOX_KAFKA_SSL_CAFILE": str(secure_kafka.authority.certfile),
        "OUTBOX_LAKE_ROOT": str(lake),
        "OUTBOX_LAKE_TOPIC_PATTERN": f"^{topic_for(aggregate_type)}$",
    }
    done = run_outbox("lake", "ingest", "--available-now", env=env, timeout=420)
    assert done.returncode == 0, done.stderr[-3000:]
    landed = DeltaTable(str(lake / "events")).to_pyarrow_table().column("event_id").to_pylist()
    assert sorted(str(event_id) for event_id in landed) == sorted(ids)
    assert secure_kafka.passwords["lake"] not in done.stdout + done.stderr

    password_file.write_text("not-the-password")
    started = time.monotonic()
    failed = run_outbox("lake", "ingest", "--available-now", env=env, timeout=420)
    assert failed.returncode != 0
    assert "refused the login of user 'lake'" in failed.stderr, failed.stderr[-3000:]
    assert time.monotonic() - started < 120  # a whole CLI process, Spark's start included


# -- outside the ACLs ----------------------------------------------------------------------------


def test_a_group_outside_the_consumers_acls_is_refused_naming_it(
    secure_kafka: SecureKafka, migrated: ScratchDatabase
) -> None:
    engine = sa.create_engine(migrated.url)
    consumer: IdempotentConsumer[Any] = IdempotentConsumer(
        name="secure",
        group_id="someone-elses-group",
        kafka=secure_kafka.mtls("consumer"),
        begin=engine.begin,
        handler=lambda _connection, _event: None,
        pattern=r"^outbox\.event\..*",
    )
    try:
        with pytest.raises(BrokerAuthorizationError) as raised:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                consumer.poll_once(timeout_seconds=0.5)
    finally:
        consumer.close()
        engine.dispose()
    assert raised.value.resource == "group" and "someone-elses-group" in str(raised.value)


def test_readers_may_not_write_and_the_relay_may_write_only_outbox_topics(
    secure_kafka: SecureKafka,
) -> None:
    from kafka import KafkaProducer

    def send(settings: KafkaSettings, topic: str) -> None:
        with kafka_errors(settings):
            producer = KafkaProducer(**client_options(settings, client_id="tests"), acks="all")
            try:
                producer.send(topic, b"x").get(timeout=20)
            finally:
                producer.close(timeout=0)

    for user, topic in (
        ("relay", "not-an-outbox-topic"),
        ("relay", "outbox-connect-configs"),
        ("reconcile", topic_for("order")),
        ("lake", topic_for("order")),
    ):
        with pytest.raises(BrokerAuthorizationError) as raised:
            send(secure_kafka.sasl(user), topic)
        assert raised.value.resource == "topic" and raised.value.names == topic, user
        assert f"User:{user}" in str(raised.value)
    assert "outbox-connect-configs" not in topic_names(secure_kafka.sasl("relay"), ".*")


def test_a_reader_outside_its_acls_is_refused_naming_the_topic(
    secure_kafka: SecureKafka,
) -> None:
    reader = KafkaReader(secure_kafka.sasl("stranger"), ROLE)
    try:
        assert reader.topics(".*") == []  # no ACL: it sees no topic at all
        reader.assign([(topic_for("order"), 0)])
        started = time.monotonic()
        with pytest.raises(BrokerAuthorizationError) as raised:
            while time.monotonic() < started + 20:
                reader.poll(0.5)
        assert time.monotonic() - started < FAILS_WITHIN_SECONDS
    finally:
        reader.close()
    assert raised.value.resource == "topic" and topic_for("order") in raised.value.names


# -- Kafka Connect -----------------------------------------------------------------------------


def test_connect_streams_cdc_records_end_to_end_as_its_principal(
    secure_connect: SecureConnect, migrated: ScratchDatabase, cluster: PostgresCluster
) -> None:
    secure = secure_connect.kafka
    worker = secure_connect.worker
    services = KafkaServices(worker.settings, cluster, secure.broker, worker)
    pid = worker.process.pid()
    assert pid is not None
    command_line = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    properties = (worker.home / "worker.properties").read_text()
    for secret in (secure.passwords["connect"],):
        assert secret not in command_line and secret not in properties
    assert (worker.home / "worker.properties").stat().st_mode & 0o077 == 0

    aggregate_type = f"cdc{uuid.uuid4().hex[:8]}"
    with cdc_path_for(services, migrated, topic_prefix=CDC_TOPIC_PREFIX):
        ids = publish(migrated, aggregate_type, 10)
        records = read_until(
            secure.sasl("reconcile"),  # type: ignore[arg-type]
            topic_for(aggregate_type),
            lambda r: len(r) >= len(ids),
            timeout=120,
        )
    assert sorted(str(event_id_of(r.headers)) for r in records) == sorted(ids)
