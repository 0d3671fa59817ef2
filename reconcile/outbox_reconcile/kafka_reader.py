"""Reads every copy of every event on the outbox topics (the project's reading layer,
:mod:`outbox.kafka_reading`, partitions assigned by hand).

No consumer group: nothing is committed, nothing another consumer sees changes. Each
partition is read from its beginning (or, with ``--since``, from the broker's offset for that
time less a margin) to its end as the broker gave it when reconcile started: for committed
records, the last stable offset (:mod:`outbox.core.partition_end`). A partition that cannot be
read to that end (Kafka stops answering for it for ``stall_seconds``, or its records are
deleted under the read) raises :class:`~outbox.core.errors.ShortReadError`, naming the topic,
the partition and the offsets: a report is never made of a partial read.

What is read is handed to :class:`Evidence` one poll at a time (at most 5,000 records), so
memory does not grow with the topics; the offsets read per partition are recorded (a lake
row outside them cannot be judged against Kafka). A record no reader can take at its word (a
header name that is not UTF-8) is evidence too, with its offsets: a finding.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

from outbox.core.errors import ShortReadError
from outbox.core.kafka_record import KafkaRecord, Undecodable, undecodable
from outbox.core.partition_end import Partition
from outbox.kafka_reading import KafkaReader, ReaderRole
from outbox.settings import KafkaSettings
from outbox_reconcile.evidence import Evidence
from outbox_reconcile.records import KafkaCopy, Malformed, Window, copy_of, earliest_copy_ms

__all__ = ["KafkaRead", "KafkaReadError", "read_kafka"]

_ROLE = ReaderRole(
    client_id="outbox-reconcile",
    max_poll_records=5000,
    fetch_max_bytes=16 * 2**20,
    max_partition_fetch_bytes=2**20,
)

KafkaReadError = ShortReadError
"""Kept for callers of the name it had before the reading layer."""


@dataclass
class KafkaRead:
    records: int = 0
    partitions: int = 0
    ranges: dict[tuple[str, int], tuple[int, int]] = field(default_factory=dict)


def read_kafka(
    kafka: KafkaSettings | str,
    topic_pattern: str,
    evidence: Evidence,
    window: Window,
    *,
    stall_seconds: float = 60.0,
    advance: Callable[[int], None] = lambda _: None,
) -> KafkaRead:
    reader = KafkaReader(kafka, _ROLE)
    read = KafkaRead()
    try:
        partitions = reader.partitions(reader.topics(re.compile(topic_pattern)))
        read.partitions = len(partitions)
        if not partitions:
            return read
        starts: dict[Partition, int] = reader.beginnings(partitions)
        ends = reader.ends(partitions)
        if window.since_ms is not None:
            found = reader.offsets_for_times(partitions, earliest_copy_ms(window.since_ms))
            for partition, at in found.items():
                starts[partition] = ends[partition] if at is None else max(starts[partition], at)

        def take(records: list[KafkaRecord]) -> None:
            chunk: list[KafkaCopy | Malformed] = []
            unreadable: list[Undecodable] = []
            for record in records:
                unread = undecodable(record)
                if unread is not None:
                    if window.holds_ms(record.timestamp_ms):  # its id cannot be trusted
                        unreadable.append(unread)
                    continue
                copy = copy_of(
                    topic=record.topic,
                    partition=record.partition,
                    offset=record.offset,
                    timestamp_ms=record.timestamp_ms,
                    key=record.key,
                    headers=record.headers,
                    value=record.value,
                )
                if isinstance(copy, Malformed) or window.holds(copy.event_id):
                    chunk.append(copy)
            evidence.add_kafka(chunk)
            evidence.add_undecodable(unreadable)
            read.records += len(records)
            advance(len(records))

        ranges = reader.read_to_end(starts, take, stall_seconds=stall_seconds, ends=ends)
        for partition, done in ranges.items():
            read.ranges[(partition[0], partition[1])] = (done.start, done.end)
            evidence.set_kafka_range(partition[0], partition[1], done.start, done.end)
        return read
    finally:
        reader.close()
