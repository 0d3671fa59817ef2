"""How far the lake has read, kept in the ``events`` table's own commits.

Every commit the ingest job makes to ``events`` (one per micro-batch, empty or not) carries,
in its commit info's ``userMetadata``, the lake's whole progress after that batch
(:class:`LakeProgress`): per topic partition the offset after its last record, the topic's
Kafka id and a fingerprint of that record (:mod:`outbox_lake.offsets`); and how far the typed
tables have come (``typed_through``: the ``events`` version they hold every row of). The
rows and the progress that names them are one atomic commit, as kafka-delta-ingest keeps its
offsets in its Delta commits: no table to keep in step, no crash between the two.

The progress is never used to *skip* anything (every write keeps only the event ids the
table lacks); it serves to

- start a query that has no checkpoint (deleted, renamed, moved aside) where the lake
  stands, with the data-loss checks of :mod:`outbox_lake.offsets`;
- tell, before a batch is written, that a topic was replaced or the broker is another one;
- let readers (``outbox reconcile``, ``outbox lake tables``) see how far the lake has come:
  ``events`` at the version whose commit says so holds everything it names.

The rule by which progress moves (:func:`advanced`) is pure. Lakes of earlier releases kept
their progress elsewhere: :mod:`outbox_lake.upgrade` reads those.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from outbox_lake.offsets import Partition, Progress

if TYPE_CHECKING:
    from deltalake import DeltaTable

__all__ = ["HISTORY_SEARCHED", "METADATA_KEY", "LakeProgress", "advanced", "latest_progress"]

log = logging.getLogger("outbox.lake.progress")

METADATA_KEY = "outbox_lake_progress"
"""The key that marks our ``userMetadata`` (a JSON object) in a commit of ``events``."""
HISTORY_SEARCHED = 1_000
"""How many of ``events``' latest commits are searched for the last progress (commits by
``outbox lake maintain`` come between the job's; they are few)."""


@dataclass(frozen=True)
class LakeProgress:
    partitions: Mapping[Partition, Progress] = field(default_factory=dict)
    typed_through: int | None = None
    """The ``events`` version whose rows are all in the typed tables (None: none known)."""

    def to_metadata(self) -> str:
        """The commit's ``userMetadata``: compact JSON, sorted (stable across runs)."""
        rows = [
            [where.topic, where.partition, p.end_offset, p.topic_id, p.last_record]
            for where, p in sorted(self.partitions.items())
        ]
        return json.dumps(
            {METADATA_KEY: 1, "partitions": rows, "typed_through": self.typed_through},
            separators=(",", ":"),
        )

    @classmethod
    def from_metadata(cls, text: str | None) -> LakeProgress | None:
        """The progress a commit's ``userMetadata`` holds; None when it is not ours."""
        if not text or METADATA_KEY not in text:
            return None
        try:
            data = json.loads(text)
            if not isinstance(data, dict) or data.get(METADATA_KEY) != 1:
                return None
            partitions = {
                Partition(str(topic), int(number)): Progress(
                    int(end), None if topic_id is None else str(topic_id), last
                )
                for topic, number, end, topic_id, last in data["partitions"]
            }
            typed = data.get("typed_through")
            return cls(partitions, None if typed is None else int(typed))
        except (ValueError, KeyError, TypeError):
            log.warning("a commit of events holds progress that cannot be read: ignored")
            return None


def advanced(
    known: Mapping[Partition, Progress],
    ends: Mapping[Partition, tuple[int, str | None]],
    topic_ids: Mapping[str, str | None],
    *,
    started_over: frozenset[str] = frozenset(),
) -> dict[Partition, Progress]:
    """The progress after a batch that read up to ``ends`` ({partition: (offset after its
    last record, that record's fingerprint)}).

    - An offset never moves back for the same log: a batch that re-read records (a replay,
      a deleted checkpoint) leaves it where it was.
    - A topic whose Kafka id is not the one progress holds is another log: its partitions
      take the batch's ends, whatever they are.
    - ``started_over``: topics the lake reads again from their start (a replaced topic,
      data loss skipped on purpose): what progress held of them is dropped first.
    - An id learned for a topic whose progress had none is kept; a batch for which the
      broker named no id keeps the known one.
    """
    result = {where: p for where, p in known.items() if where.topic not in started_over}
    for where, (end, last) in ends.items():
        before = result.get(where)
        # the broker named no id (a metadata gap): the known one stands
        topic_id = topic_ids.get(where.topic) or (before.topic_id if before else None)
        same_log = before is not None and before.topic_id in (None, topic_id)
        if before is not None and same_log and before.end_offset >= end:
            if before.topic_id is None and topic_id is not None:
                result[where] = Progress(before.end_offset, topic_id, before.last_record)
            continue
        result[where] = Progress(end, topic_id, last)
    return result


def latest_progress(table: DeltaTable | None) -> LakeProgress | None:
    """The progress of ``events``' latest commit that holds one (None: no such commit)."""
    if table is None:
        return None
    commits: list[dict[str, Any]] = table.history(HISTORY_SEARCHED)
    for commit in commits:  # newest first
        found = LakeProgress.from_metadata(commit.get("userMetadata"))
        if found is not None:
            return found
    return None
