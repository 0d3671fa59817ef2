"""Reads every copy of every event on the outbox topics (kafka-python, manual assignment).

No consumer group: nothing is committed, nothing another consumer sees changes. Each
partition is read from its beginning (or, with ``--since`` and ``end_offsets=broker``, from
the broker's offset for that time less a margin) to where it ended when reconcile started:

- ``end_offsets=broker`` (right for Apache Kafka): the broker's end offsets, taken once at the
  start, are where each partition stops;
- ``end_offsets=scan`` (the default, any broker, including the local one whose ListOffsets
  answers are not next offsets): a partition is read until it has nothing more for
  ``idle_seconds``, or until a record produced after reconcile started.

What is read is handed to :class:`Evidence` one poll at a time (at most 5,000 records), so
memory does not grow with the topics; the offsets read per partition are recorded (a lake
row outside them cannot be judged against Kafka).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from outbox.core.errors import OutboxError
from outbox_reconcile.evidence import Evidence
from outbox_reconcile.records import KafkaCopy, Malformed, Window, copy_of

__all__ = ["KafkaRead", "KafkaReadError", "read_kafka"]

_SINCE_MARGIN_MS = 3_600_000
"""Records are produced after their event was built: seek an hour before ``--since``."""


_STALL_SECONDS = 60.0
"""``end_offsets=broker``: partitions not at their end yet, and nothing read for this long."""


class KafkaReadError(OutboxError):
    """Kafka stopped answering before every partition was read: the report would be partial."""


@dataclass
class KafkaRead:
    records: int = 0
    partitions: int = 0
    ranges: dict[tuple[str, int], tuple[int, int]] = field(default_factory=dict)


def _consumer(bootstrap_servers: str) -> Any:
    from kafka import KafkaConsumer

    return KafkaConsumer(
        bootstrap_servers=bootstrap_servers.split(","),
        isolation_level="read_committed",
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        client_id="outbox-reconcile",
        metrics_enabled=False,  # its per-topic names collide for a.b and a_b
        fetch_max_bytes=16 * 2**20,
        max_partition_fetch_bytes=2**20,
    )


def read_kafka(
    bootstrap_servers: str,
    topic_pattern: str,
    evidence: Evidence,
    window: Window,
    *,
    end_offsets: str = "scan",
    idle_seconds: float = 3.0,
    advance: Callable[[int], None] = lambda _: None,
) -> KafkaRead:
    from kafka import TopicPartition

    started_ms = int(time.time() * 1000)
    pattern = re.compile(topic_pattern)
    consumer = _consumer(bootstrap_servers)
    read = KafkaRead()
    try:
        topics = sorted(topic for topic in consumer.topics() if pattern.search(topic))
        partitions = [
            TopicPartition(topic, number)
            for topic in topics
            for number in sorted(consumer.partitions_for_topic(topic) or ())
        ]
        read.partitions = len(partitions)
        if not partitions:
            return read
        consumer.assign(partitions)
        starts: dict[Any, int] = dict(consumer.beginning_offsets(partitions))
        stops: dict[Any, int] | None = None
        if end_offsets == "broker":
            stops = dict(consumer.end_offsets(partitions))
            if window.since_ms is not None:
                found = consumer.offsets_for_times(
                    dict.fromkeys(partitions, max(0, window.since_ms - _SINCE_MARGIN_MS))
                )
                for tp, at in found.items():
                    starts[tp] = stops[tp] if at is None else max(starts[tp], at.offset)
        for tp in partitions:
            consumer.seek(tp, starts[tp])
        first: dict[Any, int] = {}
        after: dict[Any, int] = {}
        done: set[Any] = {tp for tp in partitions if stops is not None and starts[tp] >= stops[tp]}
        quiet_since = time.monotonic()
        while len(done) < len(partitions):
            batches = consumer.poll(timeout_ms=200, max_records=5000)
            if not batches:
                quiet = time.monotonic() - quiet_since
                if stops is None and quiet >= idle_seconds:
                    break
                if stops is not None and quiet >= max(_STALL_SECONDS, idle_seconds):
                    behind = sorted(
                        f"{tp.topic}[{tp.partition}]" for tp in partitions if tp not in done
                    )
                    raise KafkaReadError(
                        f"Kafka returned nothing for {quiet:.0f} s though {', '.join(behind[:5])} "
                        "are not read to their end offsets: the broker is down or the records "
                        "are gone; run reconcile again once it answers"
                    )
                continue
            quiet_since = time.monotonic()
            chunk: list[KafkaCopy | Malformed] = []
            for tp, records in batches.items():
                if tp in done:
                    continue
                for record in records:
                    if stops is not None and record.offset >= stops[tp]:
                        done.add(tp)
                        break
                    if stops is None and record.timestamp > started_ms:
                        done.add(tp)  # produced after reconcile started: the end for us
                        break
                    first.setdefault(tp, record.offset)
                    after[tp] = record.offset + 1
                    read.records += 1
                    copy = copy_of(
                        topic=tp.topic,
                        partition=tp.partition,
                        offset=record.offset,
                        timestamp_ms=record.timestamp,
                        key=record.key,
                        headers=record.headers,
                    )
                    if isinstance(copy, Malformed) or window.holds(copy.event_id):
                        chunk.append(copy)
                if stops is not None and after.get(tp, starts[tp]) >= stops[tp]:
                    done.add(tp)
                if tp in done:
                    consumer.pause(tp)
            evidence.add_kafka(chunk)
            advance(sum(len(records) for records in batches.values()))
        # A broker that went away mid-read looks like a quiet one: ask it something before
        # reporting what was read as complete (raises when it does not answer).
        consumer.beginning_offsets(partitions)
        for tp in partitions:
            start = first.get(tp, starts[tp])
            end = after.get(tp, start)
            if stops is not None:
                start, end = starts[tp], max(end, stops[tp])
            read.ranges[(tp.topic, tp.partition)] = (start, end)
            evidence.set_kafka_range(tp.topic, tp.partition, start, end)
        return read
    finally:
        consumer.close()
