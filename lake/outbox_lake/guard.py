"""The data-loss checks Spark's Kafka source does not make, against the lake's progress.

Spark's source runs with ``failOnDataLoss=false``: it never stops the stream by itself (a
topic retired and deleted once the lake had read it all must not halt the lake). This guard
makes every data-loss decision instead, with the pure rules of :mod:`outbox_lake.offsets`,
and *answers*; the loop (:mod:`outbox_lake.ingest`) *acts*:

- :class:`Refuse`: records the lake had not read are gone (retention, a topic recreated,
  a broker replaced) and ``OUTBOX_LAKE_FAIL_ON_DATA_LOSS`` is on: the job stops with a
  :class:`~outbox.core.errors.DataLossError` naming topic, partition and offsets;
- :class:`StartOver`: the same, with the setting off, for topics that are another log now:
  the query's checkpoint (offsets of the old log) is moved aside and those topics are read
  from their start; the first commit drops their old progress (never before: a crash in
  between finds the same loss again and decides the same);
- ``None``: go on (records deleted by retention with the setting off are counted in the log).

It checks at start, and before every batch, with the batch's shape.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from outbox_lake.kafka_metadata import KafkaMetadata
from outbox_lake.offsets import (
    BrokerPartition,
    Loss,
    Partition,
    Progress,
    fingerprint,
    is_replaced_topic,
    loss_message,
    losses,
    replaced_topics,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from outbox_lake.landing import BatchShape
    from outbox_lake.progress import LakeProgress

__all__ = ["LogGuard", "Refuse", "StartOver", "Verdict", "verdict"]

log = logging.getLogger("outbox.lake.guard")


@dataclass(frozen=True)
class Refuse:
    """Stop: records the lake had not read are gone."""

    reason: str


@dataclass(frozen=True)
class StartOver:
    """Read these topics again from their start (another log than the lake read)."""

    topics: frozenset[str]


Verdict = Refuse | StartOver | None


def verdict(found: list[Loss], fail_on_data_loss: bool) -> Verdict:
    """What to do about the losses found (pure)."""
    if not found:
        return None
    if fail_on_data_loss:
        return Refuse("; ".join(loss_message(loss) for loss in found))
    topics = replaced_topics(found)
    return StartOver(frozenset(topics)) if topics else None


class BatchRefused(Exception):
    """Raised inside a micro-batch to stop the query; the verdict is the guard's."""


class LogGuard:
    """``read_range(starting, ending)``: a batch read of Kafka (Spark's source), to
    fingerprint the record before where the lake stands in each partition."""

    def __init__(
        self,
        metadata: KafkaMetadata,
        read_range: Callable[[dict[str, dict[str, int]], dict[str, dict[str, int]]], DataFrame],
        fail_on_data_loss: bool,
    ) -> None:
        self.metadata = metadata
        self.read_range = read_range
        self.fail_on_data_loss = fail_on_data_loss
        self.stopped_by: Verdict = None
        """The verdict that stopped the query from inside a batch (the loop acts on it)."""

    def at_start(self, progress: LakeProgress) -> tuple[Verdict, dict[Partition, BrokerPartition]]:
        """The verdict on the broker's logs against the lake's progress, and the broker's
        partitions (for the starting offsets)."""
        broker = self.metadata.partitions()
        before = self._records_before(progress.partitions, broker)
        found = losses(progress.partitions, broker, before)
        gone = sorted({w.topic for w in progress.partitions} - {w.topic for w in broker})
        for topic in gone:
            log.warning(
                "topic %s, which the lake has read, is no longer on the broker: nothing more "
                "to read from it (retired)",
                topic,
            )
        self._log_skipped(found)
        return verdict(found, self.fail_on_data_loss), broker

    def before_batch(self, shape: BatchShape, progress: LakeProgress) -> dict[str, str | None]:
        """The topics' ids now, or :class:`BatchRefused` (``stopped_by`` set) when the
        batch would skip records: a topic of the batch replaced, records deleted between
        where the lake stands and the batch's first record."""
        topics = shape.topics
        ids = self.metadata.topic_ids(topics)
        known = progress.partitions
        replaced: list[Loss] = []
        for topic in topics:
            was = next((p for w, p in known.items() if w.topic == topic and p.topic_id), None)
            now = BrokerPartition(0, 0, ids.get(topic))
            if was is not None and is_replaced_topic(was, now):
                broker = {w: b for w, b in self.metadata.partitions().items() if w.topic == topic}
                replaced += losses({w: p for w, p in known.items() if w.topic == topic}, broker)
        gaps = [
            w for w, start in shape.starts.items() if w in known and start > known[w].end_offset
        ]
        # A batch starting below where the lake stands reads again (a replay after a crash),
        # or reads another log under the same topic id (a broker restored, a log truncated
        # and refilled): the record before where the lake stands tells which.
        behind = [
            w for w, start in shape.starts.items() if w in known and start < known[w].end_offset
        ]
        found = list(replaced)
        if gaps or behind:  # records in between may be transaction markers only: ask
            broker = self.metadata.partitions()
            suspect = {w: known[w] for w in (*gaps, *behind)}
            before = self._records_before({w: known[w] for w in behind}, broker)
            found += losses(suspect, broker, before)
        decided = verdict(found, self.fail_on_data_loss)
        self._log_skipped(found)
        if decided is not None:
            self.stopped_by = decided
            raise BatchRefused(str(decided))
        return ids

    def watch(self, metadata: KafkaMetadata, progress: LakeProgress) -> Verdict:
        """Between batches (``metadata``: a client of the caller's thread): a topic replaced
        or a partition cut below where the lake stands, which Spark's source would skip in
        silence (its offsets of the old log are ahead of the new one: no batch comes)."""
        broker = metadata.partitions()
        found = [
            loss
            for loss in losses(progress.partitions, broker)
            if loss.kind in ("replaced", "truncated")
        ]
        decided = verdict(found, self.fail_on_data_loss)
        if decided is not None:
            self._log_skipped(found)
            self.stopped_by = decided
        return decided

    def _log_skipped(self, found: list[Loss]) -> None:
        if self.fail_on_data_loss:
            return
        for loss in found:
            counted = f" ({loss.skipped} offsets)" if loss.skipped else ""
            log.error(
                "data loss skipped (OUTBOX_LAKE_FAIL_ON_DATA_LOSS=false): %s: %s%s",
                loss.partition,
                loss.what,
                counted,
            )

    def _records_before(
        self, progress: Mapping[Partition, Progress], broker: Mapping[Partition, BrokerPartition]
    ) -> dict[Partition, str | None]:
        """The fingerprint of the record at each partition's ``end_offset - 1`` now, for the
        partitions whose progress has one (None: no record there); one Spark read."""
        wanted = {
            where: p.end_offset - 1
            for where, p in progress.items()
            if p.last_record and where in broker and broker[where].earliest <= p.end_offset - 1
        }
        found: dict[Partition, str | None] = {where: None for where in wanted}
        starting: dict[str, dict[str, int]] = {}
        ending: dict[str, dict[str, int]] = {}
        for where, at in wanted.items():
            end = min(at + 1, broker[where].latest)
            if end > at:
                starting.setdefault(where.topic, {})[str(where.partition)] = at
                ending.setdefault(where.topic, {})[str(where.partition)] = end
        if not starting:
            return found
        from pyspark.sql import functions as f

        frame = self.read_range(starting, ending)
        for row in frame.select(
            "topic",
            "partition",
            "offset",
            f.unix_millis("timestamp").alias("millis"),
            "key",
            "value",
            "headers",
        ).collect():  # at most one record per partition
            where = Partition(row["topic"], int(row["partition"]))
            if wanted.get(where) == row["offset"]:
                headers = [(h["key"], h["value"]) for h in row["headers"] or []]
                stamp = int(row["millis"] or 0)
                found[where] = fingerprint(stamp, row["key"], row["value"], headers)
        return found

    def close(self) -> None:
        self.metadata.close()
