"""What the broker says of the lake's topics (on the driver): partitions, their earliest and
latest offsets (committed records: read_committed) and each topic's Kafka id.

Metadata and ListOffsets only: no record is fetched here (records are read by Spark's Kafka
source on the executors), so no record, however malformed, can make this fail.
"""

from __future__ import annotations

import logging
import re
from typing import Any

from outbox_lake.offsets import BrokerPartition, Partition

__all__ = ["KafkaMetadata"]

log = logging.getLogger("outbox.lake.metadata")


class KafkaMetadata:
    def __init__(self, bootstrap_servers: str, pattern: str) -> None:
        self.bootstrap_servers = bootstrap_servers
        self.pattern = re.compile(pattern)
        self._client: Any = None
        self._no_id_told: set[str] = set()

    def _kafka(self) -> Any:
        if self._client is None:
            from kafka import KafkaConsumer

            self._client = KafkaConsumer(
                bootstrap_servers=self.bootstrap_servers.split(","),
                isolation_level="read_committed",
                group_id=None,
                enable_auto_commit=False,
                client_id="outbox-lake",
                metrics_enabled=False,
            )
        return self._client

    def topic_ids(self, topics: list[str] | None = None) -> dict[str, str | None]:
        """{topic: its id} for the matching topics (or ``topics``); None where the broker
        gives none."""
        client = self._kafka()
        names = [t for t in client.topics() if self.pattern.search(t)] if topics is None else topics
        if topics is not None:
            client.topics()  # fresh metadata
        cluster = getattr(client, "_cluster", None)
        found: dict[str, str | None] = {}
        for topic in names:
            topic_id = cluster.topic_id(topic) if cluster is not None else None
            if topic_id is None or not getattr(topic_id, "int", 1):  # the all-zero id: unknown
                if topic not in self._no_id_told:
                    self._no_id_told.add(topic)
                    log.warning(
                        "the broker gives no id for topic %s: a recreated topic "
                        "is told by its last record only",
                        topic,
                    )
                found[topic] = None
            else:
                found[topic] = str(topic_id)
        return found

    def partitions(self) -> dict[Partition, BrokerPartition]:
        """Every partition of the matching topics, with its offsets and topic id."""
        from kafka import TopicPartition

        client = self._kafka()
        ids = self.topic_ids()
        parts = [
            TopicPartition(topic, number)
            for topic in sorted(ids)
            for number in sorted(client.partitions_for_topic(topic) or ())
        ]
        if not parts:
            return {}
        first = client.beginning_offsets(parts)
        last = client.end_offsets(parts)
        return {
            Partition(tp.topic, tp.partition): BrokerPartition(
                int(first[tp]), int(last[tp]), ids.get(tp.topic)
            )
            for tp in parts
        }

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
