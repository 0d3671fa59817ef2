"""Broker conformance: each behaviour of a Kafka broker that the project relies on, one test each.

Run it against your own cluster before adopting the project (Apache Kafka, Redpanda, MSK...):

    make test-broker OUTBOX_KAFKA_BOOTSTRAP_SERVERS=host:port

Without that setting it runs on the local stack's broker (Apache Kafka, one KRaft node).
It creates topics named ``outbox-conformance-*`` and leaves them. Every client
setting here is one the relay, Connect or the lake job uses, and valid for Apache Kafka.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import NewTopic
from kafka.errors import KafkaError, OffsetOutOfRangeError
from kafka.structs import OffsetAndMetadata

from tests.broker.conftest import BrokerUnderTest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

# Short group timings: a first join completes within seconds on every broker (STACK.md).
GROUP_TIMINGS = {"session_timeout_ms": 6000, "heartbeat_interval_ms": 1000}


def new_topic() -> str:
    return f"outbox-conformance-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def producer(broker_under_test: BrokerUnderTest) -> Iterator[KafkaProducer]:
    """The relay's producer settings: acks=all, idempotent."""
    made = KafkaProducer(
        bootstrap_servers=broker_under_test.bootstrap_servers.split(","),
        acks="all",
        enable_idempotence=True,
        max_in_flight_requests_per_connection=5,
        linger_ms=5,
        max_request_size=2_000_000,
    )
    yield made
    made.close()


def create(broker: BrokerUnderTest, topic: str, partitions: int) -> None:
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap_servers.split(","))
    try:
        admin.create_topics([NewTopic(topic, partitions, 1)])
    finally:
        admin.close()


def consumer(broker: BrokerUnderTest, **settings: Any) -> KafkaConsumer:
    options: dict[str, Any] = {
        "enable_auto_commit": False,
        "auto_offset_reset": "earliest",
        "fetch_max_bytes": 4_000_000,
        "max_partition_fetch_bytes": 4_000_000,
    }
    return KafkaConsumer(
        bootstrap_servers=broker.bootstrap_servers.split(","), **{**options, **settings}
    )


def read_partition(
    broker: BrokerUnderTest, tp: TopicPartition, count: int, *, start: int | None = None
) -> list[Any]:
    """``count`` records of one partition by manual assignment, from ``start`` (or the start)."""
    reader = consumer(broker)
    try:
        reader.assign([tp])
        if start is None:
            reader.seek_to_beginning(tp)
        else:
            reader.seek(tp, start)
        records: list[Any] = []
        deadline = time.monotonic() + 30
        while len(records) < count and time.monotonic() < deadline:
            records += reader.poll(timeout_ms=500).get(tp, [])
        return records
    finally:
        reader.close()


def test_idempotent_acks_all_produce_gives_each_record_one_offset_in_send_order(
    broker_under_test: BrokerUnderTest, producer: KafkaProducer
) -> None:
    """The relay and Connect produce with acks=all and idempotence: every acknowledged record
    is stored once, at consecutive offsets, in send order."""
    topic = new_topic()
    create(broker_under_test, topic, 1)
    futures = [producer.send(topic, key=b"k", value=str(n).encode()) for n in range(200)]
    producer.flush(timeout=60)
    offsets = [future.get(timeout=10).offset for future in futures]
    assert offsets == list(range(offsets[0], offsets[0] + 200))
    records = read_partition(broker_under_test, TopicPartition(topic, 0), 200)
    assert [r.value for r in records] == [str(n).encode() for n in range(200)]
    assert [r.offset for r in records] == offsets


def test_headers_come_back_byte_exact_including_empty_values(
    broker_under_test: BrokerUnderTest, producer: KafkaProducer
) -> None:
    """The event id, type, traceparent and the application's headers travel as headers: order,
    names and bytes kept, an empty value stays empty (not dropped, not null)."""
    topic = new_topic()
    headers = [
        ("id", uuid.uuid4().bytes),
        ("eventType", b""),
        ("traceparent", b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"),
        ("bytes", bytes(range(256))),
        ("eventType", "é".encode()),  # a repeated name keeps both, in order
    ]
    producer.send(topic, key=b"k", value=b"v", headers=headers).get(timeout=30)
    records = read_partition(broker_under_test, TopicPartition(topic, 0), 1)
    assert len(records) == 1
    assert records[0].headers == headers


def test_one_key_always_lands_on_one_partition_in_send_order(
    broker_under_test: BrokerUnderTest, producer: KafkaProducer
) -> None:
    """Per-aggregate order rests on this: records keyed by the aggregate id go to the
    partition the key hashes to, and are stored there in send order."""
    topic = new_topic()
    create(broker_under_test, topic, 4)
    sent: dict[bytes, list[tuple[int, bytes]]] = {}
    for n in range(120):
        key = f"order-{n % 12}".encode()
        metadata = producer.send(topic, key=key, value=str(n).encode()).get(timeout=30)
        sent.setdefault(key, []).append((metadata.partition, str(n).encode()))
    assert all(len({partition for partition, _ in values}) == 1 for values in sent.values())
    assert len({values[0][0] for values in sent.values()}) > 1, "12 keys spread over partitions"
    per_partition: dict[int, list[Any]] = {}
    for values in sent.values():
        per_partition.setdefault(values[0][0], []).extend(values)
    for partition, values in per_partition.items():
        tp = TopicPartition(topic, partition)
        per_partition[partition] = read_partition(broker_under_test, tp, len(values))
    for key, values in sent.items():
        records = per_partition[values[0][0]]
        assert [r.value for r in records if r.key == key] == [value for _, value in values]


def test_manual_assignment_and_seek_read_from_the_given_offset(
    broker_under_test: BrokerUnderTest, producer: KafkaProducer
) -> None:
    """The relay's CDC watch and the lake job assign partitions themselves (no group) and seek
    to offsets they stored: reading starts exactly there."""
    topic = new_topic()
    create(broker_under_test, topic, 1)
    for n in range(20):
        producer.send(topic, value=str(n).encode())
    producer.flush(timeout=30)
    tp = TopicPartition(topic, 0)
    from_seven = read_partition(broker_under_test, tp, 13, start=7)
    assert [r.value for r in from_seven] == [str(n).encode() for n in range(7, 20)]
    assert [r.value for r in read_partition(broker_under_test, tp, 20)][:3] == [b"0", b"1", b"2"]


def test_committed_offsets_are_returned_to_the_next_consumer_of_the_group(
    broker_under_test: BrokerUnderTest, producer: KafkaProducer
) -> None:
    """Consumers of the project's topics (the effects consumer, users' services) resume from
    the offset their group committed."""
    topic = new_topic()
    group = f"outbox-conformance-{uuid.uuid4().hex[:8]}"
    create(broker_under_test, topic, 1)
    for n in range(10):
        producer.send(topic, value=str(n).encode())
    producer.flush(timeout=30)
    tp = TopicPartition(topic, 0)
    first = consumer(broker_under_test, group_id=group, **GROUP_TIMINGS)
    try:
        first.assign([tp])
        first.commit({tp: OffsetAndMetadata(6, "", -1)})
    finally:
        first.close()
    second = consumer(broker_under_test, group_id=group, **GROUP_TIMINGS)
    try:
        second.assign([tp])
        committed = second.committed(tp)
        assert committed == 6
        second.seek(tp, committed)
        records: list[Any] = []
        deadline = time.monotonic() + 30
        while len(records) < 4 and time.monotonic() < deadline:
            records += second.poll(timeout_ms=500).get(tp, [])
        assert [r.value for r in records] == [b"6", b"7", b"8", b"9"]
    finally:
        second.close()


def test_topics_are_created_on_first_produce_and_explicitly_as_asked(
    broker_under_test: BrokerUnderTest, producer: KafkaProducer
) -> None:
    """Debezium and the relay write to ``outbox.event.<type>`` without creating it, so the
    broker must create a topic on first produce (Apache Kafka's auto.create.topics.enable);
    Connect creates its own topics with the partition count it asks for."""
    auto = new_topic()
    producer.send(auto, value=b"first").get(timeout=30)
    explicit = new_topic()
    create(broker_under_test, explicit, 3)
    reader = consumer(broker_under_test)
    try:
        assert reader.partitions_for_topic(auto), f"{auto} was not created on first produce"
        assert reader.partitions_for_topic(explicit) == {0, 1, 2}
    finally:
        reader.close()


def test_metadata_gives_each_topic_an_id_and_a_recreated_topic_a_new_one(
    broker_under_test: BrokerUnderTest, producer: KafkaProducer
) -> None:
    """The lake records each topic's id beside its offsets: a topic recreated and refilled
    past where the lake stood, or a broker replaced under its checkpoint, is told apart from
    the log the lake read only by its id (Kafka 2.8+, KIP-516). Without ids that stays silent
    (docs/operations.md, 'Data loss')."""
    topic = new_topic()
    create(broker_under_test, topic, 1)
    admin = KafkaAdminClient(bootstrap_servers=broker_under_test.bootstrap_servers.split(","))

    def topic_id(name: str) -> str | None:
        """The topic's id in fresh metadata, once the broker lists it (None: no id)."""
        deadline = time.monotonic() + 30
        while True:
            (described,) = admin.describe_topics([name])
            if described["error_code"] == 0:
                found = described.get("topic_id")
                zero = "00000000-0000-0000-0000-000000000000"
                return None if found in (None, zero) else str(found)
            assert time.monotonic() < deadline, f"{name} not in the metadata after 30 s"
            time.sleep(0.2)  # metadata propagates: nothing else to await

    try:
        first = topic_id(topic)
        assert first is not None, f"{broker_under_test.name} gives topics no id in its metadata"
        auto = new_topic()  # how outbox topics come to be: Debezium's or the relay's first send
        producer.send(auto, value=b"first").get(timeout=30)
        assert topic_id(auto) not in (None, first), "a topic made on first produce"
        admin.delete_topics([topic])
        deadline = time.monotonic() + 30
        while topic in admin.list_topics():
            assert time.monotonic() < deadline, f"{topic} still listed 30 s after its deletion"
            time.sleep(0.2)
        admin.create_topics([NewTopic(topic, 1, 1)])
        second = topic_id(topic)
        assert second is not None and second != first, (first, second)
    finally:
        admin.close()


def test_end_offsets_count_every_acknowledged_record(
    broker_under_test: BrokerUnderTest, producer: KafkaProducer
) -> None:
    """Every reader of ours reads a partition up to its end offset (ListOffsets), so the end
    offset must count every acknowledged record, and every record below it be fetchable."""
    topic = new_topic()
    create(broker_under_test, topic, 1)
    futures = [producer.send(topic, value=str(n).encode()) for n in range(50)]
    producer.flush(timeout=30)
    last = max(future.get(timeout=10).offset for future in futures)
    tp = TopicPartition(topic, 0)
    reader = consumer(broker_under_test)
    try:
        reader.assign([tp])
        reader.seek_to_beginning(tp)
        records: list[Any] = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            batch = reader.poll(timeout_ms=1000).get(tp, [])
            if not batch and len(records) >= 50:
                break  # an empty fetch at the end: the scan's stop condition
            records += batch
        assert [r.offset for r in records][-1] == last and len(records) == 50
        end = reader.end_offsets([tp])[tp]
        assert reader.beginning_offsets([tp])[tp] <= records[0].offset
    finally:
        reader.close()
    assert end == last + 1, f"{broker_under_test.name} reports end offset {end}, not {last + 1}"


def test_a_record_of_almost_a_mebibyte_is_stored_and_a_larger_one_refused_or_kept_whole(
    broker_under_test: BrokerUnderTest, producer: KafkaProducer
) -> None:
    """The relay sends records up to its max_request_bytes (1 MiB by default) and dead-letters
    what the broker refuses: a 900 kB record must be stored byte-exact; a 1.5 MB one is either
    refused with an error (Apache Kafka's default limit) or stored whole, never acknowledged
    and lost or cut."""
    topic = new_topic()
    create(broker_under_test, topic, 1)
    tp = TopicPartition(topic, 0)
    near = uuid.uuid4().bytes * (900_000 // 16)
    producer.send(topic, value=near).get(timeout=60)
    big = uuid.uuid4().bytes * (1_500_000 // 16)
    try:
        stored_big = producer.send(topic, value=big).get(timeout=60)
    except KafkaError as refused:
        assert "TooLarge" in type(refused).__name__ or "too large" in str(refused).lower()
        stored_big = None
    records = read_partition(broker_under_test, tp, 2 if stored_big else 1)
    assert records[0].value == near
    if stored_big is not None:
        assert len(records) == 2 and records[1].value == big


def _beginning(broker: BrokerUnderTest, tp: TopicPartition) -> int:
    reader = consumer(broker)
    try:
        return int(reader.beginning_offsets([tp])[tp])
    finally:
        reader.close()


def _reads_below_the_start_are_out_of_range(broker: BrokerUnderTest, tp: TopicPartition) -> None:
    """A reader that asks for a removed offset gets an error it can report as data loss (the
    lake and reconcile do), not records from elsewhere nor silence."""
    reader = consumer(broker, auto_offset_reset="none")
    try:
        reader.assign([tp])
        reader.seek(tp, 0)
        deadline = time.monotonic() + 30
        with pytest.raises(OffsetOutOfRangeError):
            while time.monotonic() < deadline:
                assert not reader.poll(timeout_ms=500), "records below the log start"
    finally:
        reader.close()


def test_deleted_records_move_the_log_start_and_reads_below_it_fail(
    broker_under_test: BrokerUnderTest, producer: KafkaProducer
) -> None:
    """``delete_records`` (what an operator runs to drop a poison range) moves the partition's
    start; the records above it stay readable, a read below it is out of range."""
    topic = new_topic()
    create(broker_under_test, topic, 1)
    for n in range(10):
        producer.send(topic, value=str(n).encode())
    producer.flush(timeout=30)
    tp = TopicPartition(topic, 0)
    admin = KafkaAdminClient(bootstrap_servers=broker_under_test.bootstrap_servers.split(","))
    try:
        admin.delete_records({tp: 6})
    finally:
        admin.close()
    assert _beginning(broker_under_test, tp) == 6
    assert [r.value for r in read_partition(broker_under_test, tp, 4)] == [b"6", b"7", b"8", b"9"]
    _reads_below_the_start_are_out_of_range(broker_under_test, tp)


@pytest.mark.timeout(240)
def test_retention_removes_old_records_and_moves_the_log_start(
    broker_under_test: BrokerUnderTest, producer: KafkaProducer
) -> None:
    """Time-based retention removes whole closed segments: a topic with 1 s retention and
    100 ms segments loses its first records once later ones roll the segment. The local
    broker checks retention every 2 s (``log.retention.check.interval.ms``); on a cluster with
    Kafka's default (5 minutes) this test may take that long, within its time bound."""
    topic = new_topic()
    admin = KafkaAdminClient(bootstrap_servers=broker_under_test.bootstrap_servers.split(","))
    try:
        admin.create_topics(
            [NewTopic(topic, 1, 1, topic_configs={"retention.ms": "1000", "segment.ms": "100"})]
        )
    finally:
        admin.close()
    tp = TopicPartition(topic, 0)
    producer.send(topic, value=b"old").get(timeout=30)
    deadline = time.monotonic() + 200
    while _beginning(broker_under_test, tp) == 0:
        assert time.monotonic() < deadline, "retention never removed the first segment"
        producer.send(topic, value=b"later").get(timeout=30)  # rolls the segment
        time.sleep(0.5)  # a steady trickle while the broker's retention check comes round
    _reads_below_the_start_are_out_of_range(broker_under_test, tp)
