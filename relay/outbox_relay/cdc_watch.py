"""Auto mode: what did CDC deliver? Read it back from Kafka.

The leader reads every outbox topic (``outbox.event.*``; new ones are found within a few
seconds) and the connector's heartbeat topic, with a reader of its own
(:mod:`outbox.kafka_reading`): partitions are assigned by the relay, not by a consumer group,
and the offsets live in PostgreSQL, written in the same transaction that deletes the
delivered rows, so the two cannot disagree. Each record's ``id`` header names an outbox row
that is now on Kafka. Heartbeat records tell when CDC last streamed. A record no reader can
take at its word (a header name that is not UTF-8) confirms nothing: it is logged with its
offsets and counted, and the watch goes on past it.

(A consumer group was tried first: with a pattern subscription, every new topic triggers a
rebalance, and on the local broker the consumer stalled after one; and its offsets would
live apart from the deletes.)
"""

from __future__ import annotations

import logging
import re
import time
import uuid
from dataclasses import dataclass, field

from outbox.core.contract import TOPIC_PREFIX, event_id_of
from outbox.core.kafka_record import Undecodable, undecodable
from outbox.core.partition_end import Partition, ReadToEnd
from outbox.kafka_reading import KafkaReader, ReaderRole
from outbox.settings import KafkaSettings

__all__ = ["CdcDeliveries", "CdcWatch", "Offsets"]

log = logging.getLogger("outbox.relay.cdc_watch")

Offsets = dict[tuple[str, int], int]
"""Next offset to read, per (topic, partition)."""

_ROLE = ReaderRole(
    client_id="outbox-relay-cdc-watch",
    # A stored offset whose records retention deleted: what CDC delivered there can no longer
    # be confirmed; its rows stay until the relay publishes them (a copy, never a loss).
    when_offsets_gone="earliest",
    max_poll_records=5000,
    fetch_max_wait_ms=50,
)
_REFRESH_SECONDS = 3.0


@dataclass
class CdcDeliveries:
    event_ids: list[uuid.UUID] = field(default_factory=list)
    latest_heartbeat: float | None = None
    """Wall-clock seconds when the newest heartbeat record read was produced."""
    offsets: Offsets = field(default_factory=dict)
    """Next offset per partition once these are handled: store it with the deletes."""
    undecodable: list[Undecodable] = field(default_factory=list)
    """Records on the watched topics that name no outbox row anyone can read."""


class CdcWatch:
    """Reads CDC's deliveries from ``offsets`` on (earliest for partitions it never read).

    ``caught_up`` once it has listed the topics and read every partition to the end it had
    when it was assigned (the broker's end for committed records:
    :mod:`outbox.core.partition_end`). Until then the relay cannot tell a slow CDC from its
    own slow start. No topic at all counts as caught up: CDC never produced (Connect down
    from the start), and rows must not wait for it forever.
    """

    def __init__(
        self, kafka: KafkaSettings | str, *, heartbeat_topic: str, offsets: Offsets
    ) -> None:
        self._heartbeat_topic = heartbeat_topic
        self._pattern = re.compile(f"^({re.escape(TOPIC_PREFIX)}.*|{re.escape(heartbeat_topic)})$")
        self._stored = dict(offsets)
        self._assigned: set[Partition] = set()
        self._to_end = ReadToEnd({}, {}, stall_seconds=float("inf"), now=time.monotonic())
        """Each partition's end when it was assigned: caught up once every one is reached."""
        self._refresh_due = 0.0
        self._listed = False
        self._reader = KafkaReader(kafka, _ROLE)

    @property
    def caught_up(self) -> bool:
        return self._listed and self._to_end.finished

    def poll(self, timeout_seconds: float) -> CdcDeliveries:
        if time.monotonic() >= self._refresh_due:
            self._refresh()
        deliveries = CdcDeliveries()
        if not self._assigned:
            return deliveries
        for record in self._reader.poll(timeout_seconds):
            deliveries.offsets[(record.topic, record.partition)] = record.offset + 1
            unread = undecodable(record)
            if unread is not None:
                log.warning("record %s names no outbox row: %s", record.place, unread.reason)
                deliveries.undecodable.append(unread)
            elif record.topic == self._heartbeat_topic:
                produced = record.timestamp_ms / 1000
                if deliveries.latest_heartbeat is None or produced > deliveries.latest_heartbeat:
                    deliveries.latest_heartbeat = produced
            else:
                try:
                    deliveries.event_ids.append(event_id_of(record.headers))
                except ValueError:
                    continue  # not an outbox record: nothing of ours to delete
        now = time.monotonic()
        for partition in self._to_end.remaining:
            self._to_end.observe(partition, self._reader.position(partition), now)
        return deliveries

    def close(self) -> None:
        self._reader.close()

    def _refresh(self) -> None:
        """Assign the partitions of topics that appeared since the last look."""
        self._refresh_due = time.monotonic() + _REFRESH_SECONDS
        topics = self._reader.topics(self._pattern)
        self._listed = True
        new = [p for p in self._reader.partitions(topics) if p not in self._assigned]
        if not new:
            return
        self._assigned |= set(new)
        self._reader.assign(self._assigned)
        beginnings = self._reader.beginnings(new)
        starts = {}
        for partition in new:
            stored = self._stored.get((partition[0], partition[1]))
            if stored is None:
                self._reader.seek(partition, beginnings[partition])
            else:
                self._reader.seek(partition, stored)
            starts[partition] = beginnings[partition] if stored is None else stored
        self._to_end.add(starts, self._reader.ends(new), time.monotonic())
