"""Auto mode: what did CDC deliver? Read it back from Kafka.

A consumer group of the relay reads every outbox topic (``outbox.event.*``, new ones found
within seconds) and the connector's heartbeat topic. Each record's ``id`` header names an
outbox row that is now on Kafka: the relay deletes those rows, then commits the offsets (a
crash in between only deletes again). Heartbeat records tell when CDC last streamed.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass, field
from typing import Any

from kafka import KafkaConsumer

from outbox.core.contract import TOPIC_PREFIX, event_id_of

__all__ = ["CdcDeliveries", "CdcWatch"]


@dataclass
class CdcDeliveries:
    event_ids: list[uuid.UUID] = field(default_factory=list)
    latest_heartbeat: float | None = None
    """Wall-clock seconds when the newest heartbeat record read was produced."""


class CdcWatch:
    def __init__(self, bootstrap_servers: str, *, group_id: str, heartbeat_topic: str) -> None:
        self._heartbeat_topic = heartbeat_topic
        self._consumer: Any = KafkaConsumer(
            bootstrap_servers=bootstrap_servers.split(","),
            client_id="outbox-relay-cdc-watch",
            group_id=group_id,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            metadata_max_age_ms=3000,
            session_timeout_ms=10_000,
            heartbeat_interval_ms=1000,
            max_poll_interval_ms=60_000,
            max_poll_records=5000,
        )
        pattern = f"^({re.escape(TOPIC_PREFIX)}.*|{re.escape(heartbeat_topic)})$"
        self._consumer.subscribe(pattern=pattern)

    def poll(self, timeout_seconds: float) -> CdcDeliveries:
        deliveries = CdcDeliveries()
        batches = self._consumer.poll(timeout_ms=int(timeout_seconds * 1000))
        for records in batches.values():
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

    def commit(self) -> None:
        self._consumer.commit()

    def close(self) -> None:
        self._consumer.close(autocommit=False)
