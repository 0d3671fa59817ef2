"""Where the lake stands on each Kafka partition, and the decisions about lost data. (Pure.)

Spark's Kafka source keeps its own offsets in the checkpoint and notices records deleted by
retention and partitions that shrank. It does not notice a topic deleted and recreated and
refilled past where the lake stood, nor a broker replaced under the lake: offsets of
another log would silently skip its first records. The job therefore keeps, in the lake's
progress (each commit of ``events``, :mod:`outbox_lake.progress`), per partition: the
offset after the last record the lake has taken in, the topic's Kafka id, and a
fingerprint of that last record; and checks the broker against it at start and before
every batch (:func:`losses`, through :mod:`outbox_lake.guard`).

Every decision here is a named function over typed values, no I/O.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

__all__ = [
    "EARLIEST",
    "TOPIC_REPLACED",
    "BrokerPartition",
    "Loss",
    "LossKind",
    "Partition",
    "Progress",
    "fingerprint",
    "is_another_log",
    "is_replaced_topic",
    "is_truncated",
    "loss_message",
    "losses",
    "lost_to_retention",
    "replaced_topics",
    "starting_offsets",
]

TOPIC_REPLACED = "the topic on the broker is not the one the lake has read"
"""The start of the job's refusal for a topic that is another log than the lake's."""

EARLIEST = -2
"""Spark's ``startingOffsets`` value for a partition's earliest offset."""

LossKind = Literal["retention", "replaced", "truncated", "another_log"]


@dataclass(frozen=True, order=True)
class Partition:
    topic: str
    partition: int

    def __str__(self) -> str:
        return f"{self.topic}[{self.partition}]"


@dataclass(frozen=True)
class Progress:
    """How far the lake has read one partition."""

    end_offset: int
    """The offset after the last record every table has taken in."""
    topic_id: str | None = None
    last_record: str | None = None
    """:func:`fingerprint` of the record at ``end_offset - 1``, when known."""


@dataclass(frozen=True)
class BrokerPartition:
    """What the broker says of one partition now."""

    earliest: int
    latest: int
    topic_id: str | None = None


@dataclass(frozen=True)
class Loss:
    partition: Partition
    kind: LossKind
    what: str
    skipped: int | None
    """How many offsets are gone for good, when that can be told."""


def fingerprint(
    timestamp_ms: int,
    key: bytes | None,
    value: bytes | None,
    headers: Sequence[tuple[str, bytes | None]],
) -> str:
    """What tells a record from another one at the same offset of another log."""
    crc = zlib.crc32(key or b"")
    crc = zlib.crc32(value or b"", crc)
    for name, header in headers:
        crc = zlib.crc32(header or b"", zlib.crc32(name.encode("utf-8", "replace"), crc))
    return f"{timestamp_ms}-{crc:08x}"


def lost_to_retention(progress: Progress, broker: BrokerPartition) -> bool:
    """Records the lake had not read were deleted: the partition now starts above it."""
    return broker.earliest > progress.end_offset


def is_replaced_topic(progress: Progress, broker: BrokerPartition) -> bool:
    """The topic on the broker is another one than the lake read (deleted and recreated,
    or another cluster): both ids are known and differ."""
    return (
        progress.topic_id is not None
        and broker.topic_id is not None
        and progress.topic_id != broker.topic_id
    )


def is_truncated(progress: Progress, broker: BrokerPartition) -> bool:
    """The partition ends below where the lake stands."""
    return broker.latest < progress.end_offset


def is_another_log(progress: Progress, found: str | None) -> bool:
    """The record before where the lake stands is not the one it read there (``found``:
    that record's fingerprint now, None when the broker has no record there)."""
    if progress.end_offset <= 0 or progress.last_record is None:
        return False
    return found != progress.last_record


def losses(
    progress: Mapping[Partition, Progress],
    broker: Mapping[Partition, BrokerPartition],
    records_before: Mapping[Partition, str | None] | None = None,
) -> list[Loss]:
    """Every way the broker's partitions have lost records the lake has not read.

    ``records_before``: the fingerprints found at ``end_offset - 1`` (checked only for the
    partitions it names). A partition the broker no longer has is not judged here (a topic
    deleted and not recreated: nothing more to read from it).
    """
    found: list[Loss] = []
    for where, known in sorted(progress.items()):
        now = broker.get(where)
        if now is None:
            continue
        if is_replaced_topic(known, now):
            found.append(
                Loss(
                    where,
                    "replaced",
                    f"{TOPIC_REPLACED} (topic id "
                    f"{now.topic_id}, the lake read {known.topic_id}): it was deleted and "
                    "recreated, or the broker is another cluster",
                    None,
                )
            )
        elif is_truncated(known, now):
            found.append(
                Loss(
                    where,
                    "truncated",
                    f"the partition ends at offset {now.latest}, below offset "
                    f"{known.end_offset} where the lake stands: the topic was deleted and "
                    "recreated, or truncated",
                    None,
                )
            )
        elif is_another_log(known, (records_before or {}).get(where, known.last_record)):
            found.append(_another_log(where, known))
            continue
        if lost_to_retention(known, now) and not is_replaced_topic(known, now):
            found.append(
                Loss(
                    where,
                    "retention",
                    f"offsets {known.end_offset} to {now.earliest - 1} were deleted by "
                    "retention before the lake read them",
                    now.earliest - known.end_offset,
                )
            )
    return found


def replaced_topics(found: Iterable[Loss]) -> set[str]:
    """Topics to read again from their start after a loss that is skipped: another log."""
    return {loss.partition.topic for loss in found if loss.kind != "retention"}


def _another_log(where: Partition, known: Progress) -> Loss:
    return Loss(
        where,
        "another_log",
        f"the record at offset {known.end_offset - 1} is not the one the lake read there "
        "(another timestamp or content): the partition is another log than the one the lake "
        "read (the topic recreated, or a broker restored from a snapshot)",
        None,
    )


def starting_offsets(
    progress: Mapping[Partition, Progress],
    broker: Mapping[Partition, BrokerPartition],
    reread: set[str] | frozenset[str] = frozenset(),
) -> dict[str, dict[str, int]]:
    """Spark's ``startingOffsets`` for a query without a checkpoint: every partition the
    broker has, from where the lake's progress stands (clamped to what the broker still
    has), or from its earliest offset; the topics in ``reread`` from their earliest."""
    offsets: dict[str, dict[str, int]] = {}
    for where, now in sorted(broker.items()):
        known = progress.get(where)
        at = EARLIEST
        if known is not None and where.topic not in reread:
            at = min(max(known.end_offset, now.earliest), now.latest)
        offsets.setdefault(where.topic, {})[str(where.partition)] = at
    return offsets


def loss_message(loss: Loss) -> str:
    return (
        f"{loss.partition.topic if loss.kind == 'replaced' else loss.partition}: {loss.what}. "
        "The lake cannot have those records: to go on without them, restart once with "
        "OUTBOX_LAKE_FAIL_ON_DATA_LOSS=false (it reads from the earliest offset there is and "
        "logs what it skipped; events already in the lake are not duplicated); to recover "
        "them, re-publish the events from their source (see docs/operations.md, 'Data loss')"
    )
