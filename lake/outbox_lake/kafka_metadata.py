"""What the broker says of the lake's topics (on the driver): partitions, their earliest and
latest offsets (committed records: read_committed) and each topic's Kafka id.

Metadata and ListOffsets only, through the project's Kafka reading layer
(:mod:`outbox.kafka_reading`, with the security of ``OUTBOX_KAFKA_*``): no record is fetched
here (records are read by Spark's Kafka source on the executors), so no record, however
malformed, can make this fail.

A broker that does not answer (down, restarting, paused, or answering before it has
registered again: no broker and no leader in its metadata) is waited for, up to
:data:`PATIENCE_SECONDS`, as Spark's own Kafka consumers wait
(``kafka.default.api.timeout.ms``): a job started while the broker comes back, or a batch
met by a broker restart, goes on once it answers instead of stopping.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from typing import TypeVar

from outbox.core.errors import BrokerUnavailable
from outbox.kafka_reading import KafkaReader, ReaderRole
from outbox.settings import KafkaSettings, kafka_settings
from outbox_lake.offsets import BrokerPartition, Partition

__all__ = ["LAKE_CLIENT_ID", "PATIENCE_SECONDS", "KafkaMetadata"]

log = logging.getLogger("outbox.lake.metadata")
LAKE_CLIENT_ID = "outbox-lake"
PATIENCE_SECONDS = 120.0
"""How long a read waits for a broker that does not answer before it fails; Spark's Kafka
consumers get the same (``kafka.default.api.timeout.ms``,
:func:`outbox_lake.ingest.kafka_options`)."""
_LONGEST_PAUSE_SECONDS = 5.0

_T = TypeVar("_T")


class KafkaMetadata:
    """``patience_seconds``: how long each read waits for a broker that does not answer
    (0: it fails at once, as the lag metric's reads do: they must never hold the job)."""

    def __init__(
        self,
        kafka: KafkaSettings | str,
        pattern: str,
        *,
        patience_seconds: float = PATIENCE_SECONDS,
    ) -> None:
        self.kafka = kafka_settings(kafka)
        self.pattern = re.compile(pattern)
        self.patience_seconds = patience_seconds
        self._reader: KafkaReader | None = None
        self._no_id_told: set[str] = set()

    def _patiently(self, what: str, read: Callable[[], _T]) -> _T:
        """``read()``, again with a fresh client while the broker does not answer, until
        :attr:`patience_seconds` have passed."""
        deadline = time.monotonic() + self.patience_seconds
        pause = 0.5
        while True:
            try:
                return read()
            except BrokerUnavailable as error:
                self.close()  # the next try starts from the bootstrap servers again
                left = deadline - time.monotonic()
                if left <= 0:
                    raise
                log.warning(
                    "Kafka did not answer while reading %s (%s): trying again for up to %.0f s",
                    what,
                    error,
                    left,
                )
                time.sleep(min(pause, left))
                pause = min(pause * 2, _LONGEST_PAUSE_SECONDS)

    def _kafka(self) -> KafkaReader:
        if self._reader is None:
            self._reader = KafkaReader(self.kafka, ReaderRole(client_id=LAKE_CLIENT_ID))
        return self._reader

    def topic_ids(self, topics: list[str] | None = None) -> dict[str, str | None]:
        """{topic: its id} for the matching topics (or ``topics``); None where the broker
        gives none."""
        return self._patiently("the topics' ids", lambda: self._topic_ids(topics))

    def _topic_ids(self, topics: list[str] | None) -> dict[str, str | None]:
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
        return self._patiently("the topics' partitions and offsets", self._partitions)

    def _partitions(self) -> dict[Partition, BrokerPartition]:
        reader = self._kafka()
        ids = self._topic_ids(None)
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
        wanted = [(p.topic, p.partition) for p in partitions]
        found = self._patiently("end offsets", lambda: self._kafka().ends(wanted))
        return {Partition(topic, number): int(end) for (topic, number), end in found.items()}

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()
            self._reader = None
