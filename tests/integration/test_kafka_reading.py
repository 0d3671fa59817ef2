"""Every reader of ours, on the real broker, passes a record it cannot decode: a header name
that is not UTF-8, in a batch crafted byte by byte and sent in a ProduceRequest of our own
(tests/kafka_wire.py), between good records of the same batch. Apache Kafka accepts it from
any producer; kafka-python alone stops at it for ever (issue 22, item 1).

Each reader goes on past it and says where it is: the reading layer and the tests' reader,
``IdempotentConsumer`` (a dead letter), the relay's CDC watch (keeps confirming), the chaos
suite's check, the demo's wait (``outbox reconcile`` and ``outbox trace``:
tests/integration/test_reconcile.py). And the rule for a partition's end on the real broker:
past transaction markers, never short in silence.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa
from kafka import KafkaAdminClient, KafkaProducer, TopicPartition

from outbox import Event, Outbox
from outbox.consumer import IdempotentConsumer, ReceivedEvent
from outbox.core.contract import ContractRecord, topic_for
from outbox.core.errors import ShortReadError
from outbox.core.kafka_record import KafkaRecord
from outbox.kafka_reading import KafkaReader, ReaderRole
from tests.fix_cdc import cdc_path_for
from tests.fix_relay import RelayBench, sample, wait_until
from tests.fix_stack import KafkaServices
from tests.kafka_read import read_until
from tests.kafka_wire import contract_record, craft_bad_record, own_topic, send

pytestmark = pytest.mark.timeout(300)

ROLE = ReaderRole(client_id="outbox-tests-reading")
FAST_GROUP = {"session_timeout_ms": 6000, "heartbeat_interval_ms": 1000}


@dataclass
class Crafted:
    bootstrap: str
    aggregate_type: str
    good: list[ContractRecord]
    """In offset order: 0, 1, 3, 4."""
    bad_offset: int
    started: float

    @property
    def topic(self) -> str:
        return topic_for(self.aggregate_type)


@pytest.fixture
def crafted(kafka_services: KafkaServices) -> Iterator[Crafted]:
    """A topic of its own: a good record; a crafted batch (good, bad, good); a good record."""
    bootstrap = kafka_services.bootstrap_servers
    aggregate_type = f"w{uuid.uuid4().hex[:8]}"
    started = time.time()
    good = [contract_record(aggregate_type, n) for n in range(4)]
    with own_topic(bootstrap, topic_for(aggregate_type)):
        send(bootstrap, good[:1])
        bad_offset = craft_bad_record(bootstrap, aggregate_type, good[1:3])
        send(bootstrap, good[3:])
        yield Crafted(bootstrap, aggregate_type, good, bad_offset, started)


def test_the_reading_layer_reads_to_the_end_past_a_record_it_cannot_decode(
    crafted: Crafted,
) -> None:
    reader = KafkaReader(crafted.bootstrap, ROLE)
    taken: list[KafkaRecord] = []
    try:
        partitions = reader.partitions([crafted.topic])
        ranges = reader.read_to_end(reader.beginnings(partitions), taken.extend, stall_seconds=30)
    finally:
        reader.close()
    assert [r.offset for r in taken] == [0, 1, 2, 3, 4]
    assert [r.value for r in taken if r.offset != crafted.bad_offset] == [
        g.value for g in crafted.good
    ]
    (bad,) = [r for r in taken if r.unreadable is not None]
    assert bad.offset == crafted.bad_offset == 2
    assert "header name b'\\xff\\xfe-trace' (header 6 of 6) is not UTF-8" in bad.unreadable
    (done,) = ranges.values()
    assert (done.start, done.end, done.reached) == (0, 5, 5)
    # The tests' own reader goes through the same layer.
    records = read_until(crafted.bootstrap, crafted.topic, lambda r: len(r) >= 5, timeout=60)
    assert [r.offset for r in records] == [0, 1, 2, 3, 4]


def test_the_idempotent_consumer_dead_letters_it_with_its_offset_and_goes_on(
    crafted: Crafted, relay_bench: RelayBench
) -> None:
    applied: list[ReceivedEvent] = []
    engine = sa.create_engine(relay_bench.database.url)
    consumer: IdempotentConsumer[Any] = IdempotentConsumer(
        name=f"c{uuid.uuid4().hex[:6]}",
        topics=[crafted.topic],
        group_id=f"g{uuid.uuid4().hex[:6]}",
        bootstrap_servers=crafted.bootstrap,
        begin=engine.begin,
        handler=lambda _connection, event: applied.append(event),
        consumer_options=FAST_GROUP,
    )
    try:
        wait_until(
            lambda: consumer.poll_once(timeout_seconds=0.5) >= 0 and len(applied) == 4,
            timeout=90,
            what="the four good records applied, the bad one between them passed",
        )
    finally:
        consumer.close()
        engine.dispose()
    assert [event.offset for event in applied] == [0, 1, 3, 4]
    assert consumer.stats.dead_lettered == 1
    with relay_bench.database.connect() as connection:
        letters = connection.execute(
            'SELECT partition, "offset", event_id, reason, headers::text '
            "FROM outbox.outbox_inbox_dead_letter WHERE topic = %s",
            (crafted.topic,),
        ).fetchall()
    ((partition, offset, event_id, reason, headers),) = letters
    assert (partition, offset, event_id) == (0, crafted.bad_offset, None)
    assert "header name b'\\xff\\xfe-trace'" in reason and "is not UTF-8" in reason
    assert "\\\\xff\\\\xfe-trace" in headers  # the name kept, escaped


def test_the_relays_cdc_watch_keeps_confirming_past_it(relay_bench: RelayBench) -> None:
    """Auto mode, CDC delivering: the crafted record sits first in the topic CDC writes to.
    Before, the watch raised on it at every poll (a "broker error" for ever): nothing was
    confirmed, nothing cleaned up, no takeover."""
    kafka = relay_bench.kafka
    aggregate_type = f"c{uuid.uuid4().hex[:8]}"
    bootstrap = kafka.bootstrap_servers
    with (
        own_topic(bootstrap, topic_for(aggregate_type)),
        cdc_path_for(kafka, relay_bench.database) as cdc,
    ):
        around = [contract_record(aggregate_type, n) for n in range(2)]
        craft_bad_record(bootstrap, aggregate_type, around)
        with relay_bench.in_thread(
            cdc_topic_prefix=cdc.connector.topic_prefix, mode="auto", grace_seconds=120.0
        ) as relay:
            with psycopg.connect(relay_bench.database.conninfo) as connection:
                for n in range(20):
                    with connection.transaction():
                        Outbox().publish(connection, Event(aggregate_type, "7", "Done", {"n": n}))
            wait_until(
                lambda: relay_bench.undelivered() == 0,
                timeout=180,
                what="every row confirmed by CDC's record and deleted",
            )
            assert sample(relay, "outbox_relay_cdc_confirmed_total") >= 20
            assert sample(relay, "outbox_relay_cdc_undecodable_records_total") >= 1
            assert sample(relay, "outbox_relay_takeovers_total") == 0
            assert sample(relay, "outbox_relay_errors_total", kind="broker") == 0


def test_the_chaos_check_reports_it_and_reads_the_rest(crafted: Crafted) -> None:
    from chaos.truth import GroundTruth
    from chaos.verify import check, kafka_copies

    read = kafka_copies(crafted.bootstrap, rf"^{re.escape(crafted.topic)}$")
    assert [copy.offset for copy in read.copies] == [0, 1, 3, 4]
    (bad,) = read.undecodable
    assert (bad.topic, bad.partition, bad.offset) == (crafted.topic, 0, crafted.bad_offset)
    checks = check(GroundTruth(), [], read.copies, read.undecodable)
    assert checks.counts["undecodable records on Kafka"] == 1
    assert checks.examples["undecodable records on Kafka"][0].startswith(
        f"{crafted.topic}[0]@{crafted.bad_offset}: header name"
    )


def test_the_demos_wait_passes_it(crafted: Crafted, monkeypatch: pytest.MonkeyPatch) -> None:
    from outbox_stack import demo

    monkeypatch.setattr(demo, "topic_for", lambda _aggregate_type: crafted.topic)
    monkeypatch.setattr(demo, "DELIVERY_TIMEOUT_SECONDS", 60.0)
    pipeline = object.__new__(demo.DemoPipeline)
    pipeline.stack = SimpleNamespace(bootstrap_servers=crafted.bootstrap, kafka=crafted.bootstrap)
    pipeline.since = crafted.started - 1
    pipeline.await_on_kafka(4)  # returns: the four good events of this run are there


def test_a_read_ends_past_transaction_markers_at_the_last_stable_offset(
    kafka_services: KafkaServices,
) -> None:
    """Committed, aborted, committed: the log ends with a commit marker, which no record's
    offset + 1 ever reaches. The read ends there at once, with the committed records only."""
    bootstrap = kafka_services.bootstrap_servers
    topic = f"outbox.event.x{uuid.uuid4().hex[:8]}"
    with own_topic(bootstrap, topic):
        producer = KafkaProducer(
            bootstrap_servers=bootstrap, transactional_id=f"t-{uuid.uuid4().hex[:8]}"
        )
        try:
            producer.init_transactions()
            transactions = (([b"1", b"2", b"3"], True), ([b"x", b"y"], False), ([b"4"], True))
            for values, commit in transactions:
                producer.begin_transaction()
                for value in values:
                    producer.send(topic, value=value)
                if commit:
                    producer.commit_transaction()
                else:
                    producer.abort_transaction()
        finally:
            producer.close()
        reader = KafkaReader(bootstrap, ROLE)
        taken: list[KafkaRecord] = []
        try:
            partitions = reader.partitions([topic])
            end = reader.ends(partitions)[partitions[0]]
            started = time.monotonic()
            (done,) = reader.read_to_end(
                reader.beginnings(partitions), taken.extend, stall_seconds=30
            ).values()
            seconds = time.monotonic() - started
        finally:
            reader.close()
    assert [r.value for r in taken] == [b"1", b"2", b"3", b"4"]
    assert taken[-1].offset + 1 < end, "the log does not end with a transaction marker"
    assert (done.start, done.end, done.reached) == (0, end, end)
    assert seconds < 10, f"{seconds:.1f} s: the read waited for a record that never comes"


def test_records_deleted_under_a_reader_are_a_short_read_with_its_offsets(
    kafka_services: KafkaServices,
) -> None:
    """A reader that was to read from offset 0 and finds the records gone says so; before the
    layer, our readers reset to the earliest offset left, and read short in silence."""
    bootstrap = kafka_services.bootstrap_servers
    topic = f"outbox.event.x{uuid.uuid4().hex[:8]}"
    with own_topic(bootstrap, topic):
        producer = KafkaProducer(bootstrap_servers=bootstrap)
        for n in range(5):
            producer.send(topic, value=str(n).encode()).get(timeout=30)
        producer.close()
        admin = KafkaAdminClient(bootstrap_servers=bootstrap)
        try:
            admin.delete_records({TopicPartition(topic, 0): 3})
        finally:
            admin.close()
        reader = KafkaReader(bootstrap, ROLE)
        try:
            with pytest.raises(ShortReadError) as short:
                reader.read_to_end({TopicPartition(topic, 0): 0}, lambda _: None, stall_seconds=30)
        finally:
            reader.close()
    error = short.value
    assert (error.topic, error.partition, error.start, error.reached, error.end) == (
        topic,
        0,
        0,
        0,
        5,
    )
    assert "gone" in str(error)
