"""Auto mode: what did CDC deliver? Read it back from Kafka.

The leader reads every outbox topic (``outbox.event.*``; new ones are found within a few
seconds) and the connector's heartbeat topic, with a consumer of its own: partitions are
assigned by the relay, not by a consumer group, and the offsets live in PostgreSQL, written
in the same transaction that deletes the delivered rows, so the two cannot disagree. Each
record's ``id`` header names an outbox row that is now on Kafka. Heartbeat records tell when
CDC last streamed.

(A consumer group was tried first: with a pattern subscription, every new topic triggers a
rebalance, and on the local broker the consumer stalled after one; and its offsets would
live apart from the deletes.)
"""

from __future__ import annotations

import re
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from kafka import KafkaConsumer, TopicPartition
from kafka.errors import KafkaError

from outbox.core.contract import TOPIC_PREFIX, event_id_of

__all__ = ["CdcDeliveries", "CdcWatch", "Offsets"]

Offsets = dict[tuple[str, int], int]
"""Next offset to read, per (topic, partition)."""

_MAX_RECORDS = 5000
_REFRESH_SECONDS = 3.0
_QUIET_SECONDS = 1.0


@dataclass
class CdcDeliveries:
    event_ids: list[uuid.UUID] = field(default_factory=list)
    latest_heartbeat: float | None = None
    """Wall-clock seconds when the newest heartbeat record read was produced."""
    offsets: Offsets = field(default_factory=dict)
    """Next offset per partition once these are handled: store it with the deletes."""


class CdcWatch:
    """Reads CDC's deliveries from ``offsets`` on (earliest for partitions it never read).

    ``caught_up`` once it has listed the topics and read every partition to its end: polls
    have returned no record for ``_QUIET_SECONDS`` in a row since partitions were last
    assigned (each poll fetches every partition, answered at once, or after
    ``fetch_max_wait_ms`` when nothing is past its position). Until then the relay cannot tell
    a slow CDC from its own slow start. The broker's end offsets (ListOffsets) are never
    asked: some brokers undercount them (the local Tansu does), and an undercount would
    declare the watch caught up before it read what CDC had delivered. No topic at all counts
    as caught up: CDC never produced (Connect down from the start), and rows must not wait
    for it forever.
    """

    def __init__(self, bootstrap_servers: str, *, heartbeat_topic: str, offsets: Offsets) -> None:
        self._heartbeat_topic = heartbeat_topic
        self._pattern = re.compile(f"^({re.escape(TOPIC_PREFIX)}.*|{re.escape(heartbeat_topic)})$")
        self._stored = dict(offsets)
        self._assigned: set[TopicPartition] = set()
        self._unread: set[TopicPartition] = set()
        """Partitions not yet read to their end since they were assigned."""
        self._quiet_since: float | None = None
        self._refresh_due = 0.0
        self._listed = False
        self._consumer: Any = KafkaConsumer(
            bootstrap_servers=bootstrap_servers.split(","),
            isolation_level="read_committed",
            client_id="outbox-relay-cdc-watch",
            metrics_enabled=False,  # its per-topic names collide for a.b and a_b
            group_id=None,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            max_poll_records=_MAX_RECORDS,
            fetch_max_wait_ms=50,
        )

    @property
    def caught_up(self) -> bool:
        return self._listed and not self._unread

    def poll(self, timeout_seconds: float) -> CdcDeliveries:
        if time.monotonic() >= self._refresh_due:
            self._refresh()
        deliveries = CdcDeliveries()
        if not self._assigned:
            return deliveries
        batches = self._consumer.poll(timeout_ms=int(timeout_seconds * 1000))
        now = time.monotonic()
        if batches:
            self._quiet_since = None
        elif self._quiet_since is None:
            self._quiet_since = now
        elif now - self._quiet_since >= _QUIET_SECONDS:
            self._unread.clear()  # nothing past any position for a while: read to the end
        for partition, records in batches.items():
            deliveries.offsets[(partition.topic, partition.partition)] = records[-1].offset + 1
            for record in records:
                if record.topic == self._heartbeat_topic:
                    produced = record.timestamp / 1000
                    if (
                        deliveries.latest_heartbeat is None
                        or produced > deliveries.latest_heartbeat
                    ):
                        deliveries.latest_heartbeat = produced
                    continue
                try:
                    deliveries.event_ids.append(event_id_of(record.headers))
                except ValueError:
                    continue  # not an outbox record: nothing of ours to delete
        return deliveries

    def close(self) -> None:
        try:
            self._consumer.close()
        except KafkaError:
            return  # the broker is gone: nothing to hand back

    def _refresh(self) -> None:
        """Assign the partitions of topics that appeared since the last look."""
        self._refresh_due = time.monotonic() + _REFRESH_SECONDS
        topics = [topic for topic in self._consumer.topics() if self._pattern.match(topic)]
        self._listed = True
        new: set[TopicPartition] = set()
        for topic in topics:
            for number in self._consumer.partitions_for_topic(topic) or ():
                partition = TopicPartition(topic, number)
                if partition not in self._assigned:
                    new.add(partition)
        if not new:
            return
        self._assigned |= new
        self._consumer.assign(list(self._assigned))
        self._unread |= new
        self._quiet_since = None
        for partition in new:
            stored = self._stored.get((partition.topic, partition.partition))
            if stored is None:
                self._consumer.seek_to_beginning(partition)
            else:
                self._consumer.seek(partition, stored)
