"""The local broker and Kafka Connect: started by our code, really answering, stoppable."""

from __future__ import annotations

import signal
import time
import uuid

import pytest
from kafka import KafkaProducer

from outbox_stack.connect import OUTBOX_EVENT_ROUTER, POSTGRES_CONNECTOR
from tests.fix_stack import KafkaServices
from tests.kafka_read import read_count

pytestmark = pytest.mark.timeout(180)


def test_the_broker_takes_idempotent_writes_with_headers(kafka_services: KafkaServices) -> None:
    topic = f"t-{uuid.uuid4().hex[:8]}"
    producer = KafkaProducer(
        bootstrap_servers=kafka_services.bootstrap_servers, acks="all", enable_idempotence=True
    )
    try:
        for number in range(10):
            producer.send(topic, key=b"order-1", value=str(number).encode(), headers=[("id", b"x")])
        producer.flush(timeout=30)
    finally:
        producer.close()
    records = read_count(kafka_services.bootstrap_servers, topic, 10)
    assert [record.value for record in records] == [str(n).encode() for n in range(10)]
    assert all(record.headers == [("id", b"x")] for record in records)


def test_a_paused_broker_loses_nothing(kafka_services: KafkaServices) -> None:
    """SIGSTOP the broker while a producer writes, SIGCONT it: every record arrives once."""
    topic = f"pause-{uuid.uuid4().hex[:8]}"
    producer = KafkaProducer(
        bootstrap_servers=kafka_services.bootstrap_servers,
        acks="all",
        enable_idempotence=True,
        request_timeout_ms=30000,
        delivery_timeout_ms=120000,
    )
    futures = []
    try:
        for number in range(50):
            futures.append(producer.send(topic, value=str(number).encode()))
        producer.flush(timeout=30)
        kafka_services.broker.process.signal(signal.SIGSTOP)
        try:
            for number in range(50, 100):
                futures.append(producer.send(topic, value=str(number).encode()))
            time.sleep(3)  # the pause itself is what is tested: a fixed time with the broker frozen
        finally:
            kafka_services.broker.process.signal(signal.SIGCONT)
        producer.flush(timeout=60)
        assert all(future.succeeded() for future in futures)
    finally:
        producer.close()
    records = read_count(kafka_services.bootstrap_servers, topic, 100)
    assert sorted(int(record.value) for record in records) == list(range(100))


def test_connect_runs_debeziums_connector_and_event_router(kafka_services: KafkaServices) -> None:
    plugins = kafka_services.connect.plugins()
    assert {POSTGRES_CONNECTOR, OUTBOX_EVENT_ROUTER} <= plugins
    assert kafka_services.connect.client.request("GET", "/connectors") is not None
    assert kafka_services.connect.process.is_running()
