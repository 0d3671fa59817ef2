"""What the broker says of the lake's topics (on the driver): partitions, their earliest and
latest offsets (committed records: read_committed) and each topic's Kafka id.

Metadata and ListOffsets only, through the project's Kafka reading layer
(:mod:`outbox.kafka_reading`, with the security of ``OUTBOX_KAFKA_*``): no record is fetched
here (records are read by Spark's Kafka source on the executors), so no record, however
malformed, can make this fail.
"""

from __future__ import annotations

import logging
import re

from outbox.kafka_reading import KafkaReader, ReaderRole
from outbox.settings import KafkaSettings, kafka_settings
from outbox_lake.offsets import BrokerPartition, Partition

__all__ = ["LAKE_CLIENT_ID", "KafkaMetadata"]

log = logging.getLogger("outbox.lake.metadata")
LAKE_CLIENT_ID = "outbox-lake"


class KafkaMetadata:
    def __init__(self, kafka: KafkaSettings | str, pattern: str) -> None:
        self.kafka = kafka_settings(kafka)
        self.pattern = re.compile(pattern)
        self._reader: KafkaReader | None = None
        self._no_id_told: set[str] = set()

    def _kafka(self) -> KafkaReader:
        if self._reader is None:
            self._reader = KafkaReader(self.kafka, ReaderRole(client_id=LAKE_CLIENT_ID))
        return self._reader

    def topic_ids(self, topics: list[str] | None = None) -> dict[str, str | None]:
        """{topic: its id} for the matching topics (or ``topics``); None where the broker
        gives none."""
        reader = self._kafka()
        names = reader.topics(self.pattern) if topics is None else topics
        found = reader.topic_ids(names)
        for topic, topic_id in found.items():
            if topic_id is None and topic not in self._no_id_told:
                self._no_id_told.add(topic)
                log.warning(
                    "the broker gives no id for topic %s: a recreated topic "
                    "is told by its last record only",
                    topic,
                )
        return found

    def partitions(self) -> dict[Partition, BrokerPartition]:
        """Every partition of the matching topics, with its offsets and topic id."""
        reader = self._kafka()
        ids = self.topic_ids()
        parts = reader.partitions(sorted(ids))
        if not parts:
            return {}
        first = reader.beginnings(parts)
        last = reader.ends(parts)
        return {
            Partition(topic, number): BrokerPartition(
                int(first[(topic, number)]), int(last[(topic, number)]), ids.get(topic)
            )
            for topic, number in parts
        }

    def ends(self, partitions: list[Partition]) -> dict[Partition, int]:
        """The end (last stable offset) of each of ``partitions`` now."""
        found = self._kafka().ends([(p.topic, p.partition) for p in partitions])
        return {Partition(topic, number): int(end) for (topic, number), end in found.items()}

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()
            self._reader = None
