"""``outbox connect unblock`` against a real broker: a hanging transaction (one no
coordinator counts as open, tests/hanging_transaction.py) is aborted; one its coordinator
still owns is left to it, whatever its age. The whole story, Connect held at start-up and
freed, is in tests/integration/test_broker_faults.py."""

from __future__ import annotations

import uuid

import pytest
from kafka import KafkaAdminClient, KafkaProducer
from kafka.admin import NewTopic

from outbox.core.errors import BrokerError
from outbox.settings import KafkaSettings
from outbox_connect.open_transactions import open_transactions, unblock
from tests.fix_stack import KafkaServices
from tests.hanging_transaction import leave_hanging_transaction
from tests.kafka_read import read_until


def new_topic(bootstrap: str) -> str:
    topic = f"tests-unblock-{uuid.uuid4().hex[:8]}"
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.create_topics([NewTopic(topic, 1, 1)])
    finally:
        admin.close()
    return topic


def test_a_hanging_transaction_is_found_and_aborted_and_readers_go_on(
    kafka_services: KafkaServices,
) -> None:
    bootstrap = kafka_services.bootstrap_servers
    settings = KafkaSettings(bootstrap_servers=bootstrap)
    topic = new_topic(bootstrap)
    leave_hanging_transaction(bootstrap, topic)
    producer = KafkaProducer(bootstrap_servers=bootstrap)
    producer.send(topic, key=b"k", value=b"committed after it", partition=0).get(30)
    producer.close()

    (found,) = open_transactions(settings, topic)
    assert found.hanging and found.first_offset == 0, found
    assert "hanging" in found.describe()
    aborted, left = unblock(settings, topic, idle_seconds=3600)
    assert aborted == [], "a transaction aborted before it was silent long enough"
    assert [(t.producer_id, t.first_offset, t.hanging) for t in left] == [
        (found.producer_id, 0, True)
    ]

    aborted, left = unblock(settings, topic, idle_seconds=0)
    assert [t.producer_id for t in aborted] == [found.producer_id] and left == []
    # A read_committed reader now passes it: the aborted record is never read, the next is.
    records = read_until(bootstrap, topic, lambda r: len(r) >= 1, timeout=30)
    assert [r.value for r in records] == [b"committed after it"]


def test_a_topic_that_does_not_exist_is_said_not_reported_clean(
    kafka_services: KafkaServices,
) -> None:
    settings = KafkaSettings(bootstrap_servers=kafka_services.bootstrap_servers)
    with pytest.raises(BrokerError, match="OUTBOX_CONNECT_OFFSETS_TOPIC"):
        open_transactions(settings, f"tests-missing-{uuid.uuid4().hex[:8]}")


def test_a_transaction_its_coordinator_owns_is_never_aborted(
    kafka_services: KafkaServices,
) -> None:
    bootstrap = kafka_services.bootstrap_servers
    settings = KafkaSettings(bootstrap_servers=bootstrap)
    topic = new_topic(bootstrap)
    producer = KafkaProducer(
        bootstrap_servers=bootstrap, transactional_id=f"tests-owned-{uuid.uuid4().hex[:8]}"
    )
    producer.init_transactions()
    producer.begin_transaction()
    producer.send(topic, key=b"k", value=b"open", partition=0).get(30)
    try:
        aborted, left = unblock(settings, topic, idle_seconds=0)
        assert aborted == []
        (still,) = left
        assert not still.hanging and still.coordinator_state == "Ongoing", still
        assert "ends it itself" in still.describe()
    finally:
        producer.abort_transaction()
        producer.close()
    assert open_transactions(settings, topic) == []
