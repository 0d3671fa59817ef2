"""The reading layer without a broker: kafka-python's own record parsing over batches crafted
byte by byte, the decoding that never raises, the client options built in one place, and the
rule for a partition's end (a reader never returns short in silence). The same layer against
the real broker: tests/integration/test_kafka_reading.py; reconcile's read:
tests/unit/test_reconcile_kafka_read.py."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from kafka import TopicPartition
from kafka.consumer.fetcher import Fetcher
from kafka.errors import CorruptRecordError
from kafka.record.memory_records import MemoryRecords

from outbox._lenient_records import HeaderNames, _classes
from outbox.core.contract import ReceivedEvent, record_for
from outbox.core.errors import ConfigurationError
from outbox.core.kafka_record import KafkaRecord, Undecodable, decode_event
from outbox.core.partition_end import ReadToEnd
from outbox.kafka_reading import ReaderRole, consumer_options
from outbox.settings import KafkaSettings
from tests.kafka_wire import WireRecord, record_batch

BAD_NAME = b"\xff\xfetrace"
TP = TopicPartition("outbox.event.crafted", 0)


def crafted(gzipped: bool = False) -> bytes:
    return record_batch(
        [
            WireRecord(b"1", b'{"n": 1}', [(b"id", b"a")]),
            WireRecord(b"1", b'{"n": 2}', [(BAD_NAME, b"x"), (b"id", b"b")]),
            WireRecord(b"1", b'{"n": 3}', [(b"id", b"c")]),
        ],
        gzipped=gzipped,
    )


def test_kafka_python_alone_stops_at_a_header_name_that_is_not_utf8() -> None:
    """Why the adapter exists (if a kafka-python upgrade fixes this, the adapter can go)."""
    part = Fetcher.PartitionRecords(0, TP, MemoryRecords(crafted()))
    first = part.take()
    assert [record.offset for record in first] == [0]
    with pytest.raises(CorruptRecordError, match="UnicodeDecodeError"):
        part.take()


@pytest.mark.parametrize("gzipped", [False, True])
def test_every_record_of_the_batch_comes_through_in_its_place(gzipped: bool) -> None:
    part = _classes(Fetcher.PartitionRecords)(0, TP, MemoryRecords(crafted(gzipped)))
    records = part.take()
    assert [record.offset for record in records] == [0, 1, 2]
    assert [record.value for record in records] == [b'{"n": 1}', b'{"n": 2}', b'{"n": 3}']
    assert records[0].headers == [("id", b"a")] and records[2].headers == [("id", b"c")]
    bad = records[1].headers
    assert isinstance(bad, HeaderNames)
    assert bad == [("\\xff\\xfetrace", b"x"), ("id", b"b")]
    assert "header name b'\\xff\\xfetrace' (header 1 of 2) is not UTF-8" in bad.problem
    assert part.next_fetch_offset == 3  # the position passes the whole batch


def test_a_later_fetch_inside_the_batch_skips_what_was_read() -> None:
    part = _classes(Fetcher.PartitionRecords)(2, TP, MemoryRecords(crafted()))
    assert [record.offset for record in part.take()] == [2]


def received(headers: list[tuple[str, bytes | None]], unreadable: str | None = None) -> Any:
    return KafkaRecord("outbox.event.order", 0, 7, 0, b"1", b"{}", headers, unreadable)


def test_decoding_never_raises_and_names_the_place() -> None:
    good = record_for(
        event_id=uuid.uuid4(),
        aggregate_type="order",
        aggregate_id="1",
        event_type="Placed",
        payload_text="{}",
        headers_text="{}",
        traceparent="",
        position=3,
    )
    event = decode_event(received(list(good.headers)))
    assert isinstance(event, ReceivedEvent) and event.position == 3
    unread = decode_event(received(list(good.headers), unreadable="header name b'\\xff'"))
    assert unread == Undecodable("outbox.event.order", 0, 7, "header name b'\\xff'")
    assert unread.place == "outbox.event.order[0]@7"
    broken = decode_event(received([("id", b"not a uuid")]))
    assert isinstance(broken, Undecodable) and "is not a UUID" in broken.reason


def test_the_client_options_are_built_in_one_place() -> None:
    settings = KafkaSettings(bootstrap_servers="a:9092, b:9092")
    alone = consumer_options(settings, ReaderRole(client_id="x"))
    assert alone["bootstrap_servers"] == ["a:9092", "b:9092"]
    assert alone["isolation_level"] == "read_committed"
    assert alone["metrics_enabled"] is False and alone["enable_auto_commit"] is False
    assert alone["group_id"] is None and alone["auto_offset_reset"] == "none"
    assert "session_timeout_ms" not in alone
    role = ReaderRole(client_id="x", group_id="g").with_options({"session_timeout_ms": 6000})
    grouped = consumer_options(settings, role)
    assert grouped["auto_offset_reset"] == "earliest" and grouped["session_timeout_ms"] == 6000
    with pytest.raises(ConfigurationError, match="security_protocol"):
        role.with_options({"security_protocol": "SSL"})
    with pytest.raises(ConfigurationError, match="OUTBOX_KAFKA_BOOTSTRAP_SERVERS"):
        consumer_options(KafkaSettings(bootstrap_servers=None), role)


def test_a_position_past_a_transaction_marker_is_the_end() -> None:
    """Records at 0..8, a commit marker at 9: the end (10) is never a record's offset + 1."""
    read = ReadToEnd({("t", 0): 0}, {("t", 0): 10}, stall_seconds=5, now=0.0)
    assert read.keeps(("t", 0), 8) and not read.keeps(("t", 0), 10)
    read.observe(("t", 0), 9, now=1.0)
    assert not read.finished
    read.observe(("t", 0), 10, now=2.0)
    assert read.finished and read.range(("t", 0)).done


def test_a_read_that_stops_moving_before_its_end_is_reported_with_its_offsets() -> None:
    starts, ends = {("t", 0): 2, ("t", 1): 0}, {("t", 0): 10, ("t", 1): 0}
    read = ReadToEnd(starts, ends, stall_seconds=5, now=0)
    read.observe(("t", 0), 6, now=1.0)
    assert read.stalled(now=5.9) == []
    assert read.stalled(now=6.0) == [("t", 0)]  # ("t", 1) is empty: read from the start
    error = read.range(("t", 0)).short_read("no answer")
    assert (error.topic, error.partition, error.start, error.reached, error.end) == (
        "t",
        0,
        2,
        6,
        10,
    )
    assert "t[0] was read to offset 6 only, of [2, 10): no answer" in str(error)
