"""Where a partition ends, and whether a reader got there: one rule for every reader. (Pure.)

- **The end** of a partition is what the broker's ListOffsets answers for the reader's
  isolation level when the reader asks (our readers read committed records only: the *last
  stable offset*, before the first transaction still open). It is taken once, when the read
  starts; records produced later are not part of that read.
- **Read to the end** means the reader's *position* (the next offset it would fetch) is at or
  past the end. Not "the last record's offset + 1": a transaction's commit marker, or an
  aborted transaction's records, take offsets no record is returned for, so the last record
  read can sit below the end for ever while the position passes it.
- **No read ends short in silence.** A partition whose position stops moving before its end
  for ``stall_seconds`` is reported (:meth:`ReadToEnd.stalled`), with its topic, partition
  and offsets; the reader raises :class:`~outbox.core.errors.ShortReadError` from it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from outbox.core.errors import ShortReadError

__all__ = ["Partition", "PartitionRange", "ReadToEnd", "is_read_to"]

Partition = tuple[str, int]
"""``(topic, partition number)``; kafka-python's ``TopicPartition`` is one."""


def is_read_to(position: int, end: int) -> bool:
    """Whether a reader at ``position`` has read everything before ``end``."""
    return position >= end


@dataclass(frozen=True, slots=True)
class PartitionRange:
    """What a reader is to read of one partition, and how far it got: ``[start, end)``."""

    topic: str
    partition: int
    start: int
    end: int
    reached: int

    @property
    def done(self) -> bool:
        return is_read_to(self.reached, self.end)

    def short_read(self, why: str) -> ShortReadError:
        return ShortReadError(
            f"{self.topic}[{self.partition}] was read to offset {self.reached} only, of "
            f"[{self.start}, {self.end}): {why}",
            topic=self.topic,
            partition=self.partition,
            start=self.start,
            reached=self.reached,
            end=self.end,
        )


class ReadToEnd:
    """The progress of one read of some partitions, each from its start up to its end."""

    def __init__(
        self,
        starts: Mapping[Partition, int],
        ends: Mapping[Partition, int],
        *,
        stall_seconds: float,
        now: float,
    ) -> None:
        missing = set(starts) ^ set(ends)
        if missing:
            raise ValueError(f"starts and ends must name the same partitions: {missing}")
        self._stall_seconds = stall_seconds
        self._starts = dict(starts)
        self._ends = dict(ends)
        self._reached = dict(starts)
        self._moved_at = dict.fromkeys(starts, now)

    @property
    def partitions(self) -> list[Partition]:
        return list(self._starts)

    def start(self, partition: Partition) -> int:
        return self._starts[partition]

    def end(self, partition: Partition) -> int:
        return self._ends[partition]

    def keeps(self, partition: Partition, offset: int) -> bool:
        """Whether a record at ``offset`` is part of this read (records past the end arrive
        in the same fetches: they are not)."""
        return offset < self._ends[partition]

    def observe(self, partition: Partition, position: int, now: float) -> None:
        """The reader's position in ``partition``, as it stands after a poll."""
        if position != self._reached[partition]:
            self._reached[partition] = position
            self._moved_at[partition] = now

    def is_done(self, partition: Partition) -> bool:
        return is_read_to(self._reached[partition], self._ends[partition])

    @property
    def remaining(self) -> list[Partition]:
        """Partitions not read to their end yet."""
        return [p for p in self._starts if not self.is_done(p)]

    @property
    def finished(self) -> bool:
        return not self.remaining

    def stalled(self, now: float) -> list[Partition]:
        """Partitions not at their end whose position has not moved for ``stall_seconds``."""
        return [p for p in self.remaining if now - self._moved_at[p] >= self._stall_seconds]

    def range(self, partition: Partition) -> PartitionRange:
        return PartitionRange(
            topic=partition[0],
            partition=partition[1],
            start=self._starts[partition],
            end=self._ends[partition],
            reached=self._reached[partition],
        )

    def add(
        self, starts: Mapping[Partition, int], ends: Mapping[Partition, int], now: float
    ) -> None:
        """More partitions to read (a topic that appeared), each from its start to its end."""
        for partition, start in starts.items():
            self._starts[partition] = start
            self._ends[partition] = ends[partition]
            self._reached[partition] = start
            self._moved_at[partition] = now

    def forget(self, partitions: Iterable[Partition]) -> None:
        for partition in partitions:
            for table in (self._starts, self._ends, self._reached, self._moved_at):
                table.pop(partition, None)
