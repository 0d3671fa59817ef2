"""Progress kept in the lake itself: the ``_progress`` table, one row per topic partition.

After each batch has landed in every table, the job records per partition the offset after
its last record, the topic's Kafka id and a fingerprint of that last record
(:mod:`outbox_lake.offsets`). It is never used to *skip* anything (every write is an
insert-only merge keyed by the event id, so re-reading adds nothing); it serves to:

- start a query that has no checkpoint (deleted, renamed, or a lake written by an earlier
  release) where the tables stand, with the data-loss checks of :mod:`outbox_lake.offsets`;
- tell that a topic was replaced, or the broker is another one, before a batch is written;
- let readers (``outbox reconcile``, ``outbox lake tables``) see how far the lake has come:
  whatever ``_progress`` says is in every table (it is written after them).

An offset only moves forward, except for a topic whose id changed (read again from its
start after a loss that was skipped). Lakes written by earlier releases kept their progress
as Delta application transactions of the ``events`` table (``outbox-lake:<topic>:<part>``);
:meth:`ProgressStore.read` falls back to them.

Written by the driver with ``deltalake`` (a few rows per batch): on object storage a
conditional write, like every commit of ``deltalake`` (:mod:`outbox_lake.storage`), and only
ever by the one job of the lake root.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime

from outbox_lake.offsets import Partition, Progress
from outbox_lake.settings import LakeSettings
from outbox_lake.storage import open_table, storage_options
from outbox_lake.tables import EVENTS, PROGRESS_TABLE

__all__ = ["APP_PREFIX", "ProgressStore", "app_id"]

log = logging.getLogger("outbox.lake.progress")

APP_PREFIX = "outbox-lake"


def app_id(topic: str, partition: int) -> str:
    """The application transaction id earlier releases recorded progress under."""
    return f"{APP_PREFIX}:{topic}:{partition}"


class ProgressStore:
    def __init__(self, settings: LakeSettings) -> None:
        self.settings = settings
        self.uri = settings.table_uri(PROGRESS_TABLE.name)
        self._known: dict[Partition, Progress] | None = None
        self.topic_ids: dict[str, str | None] = {}
        """The topics' ids now (set by the job's check before each batch)."""

    def read(self, legacy_partitions: Iterable[Partition] = ()) -> dict[Partition, Progress]:
        """Every partition's progress; for a lake of an earlier release (no ``_progress``),
        the ``events`` table's application transactions of ``legacy_partitions``."""
        table = open_table(self.settings, self.uri)
        if table is None:
            self._known = self._legacy(legacy_partitions)
            return dict(self._known)
        rows = table.to_pyarrow_table().to_pylist()
        self._known = {
            Partition(row["topic"], int(row["partition"])): Progress(
                int(row["end_offset"]), row["topic_id"], row["last_record"]
            )
            for row in rows
        }
        return dict(self._known)

    def _legacy(self, partitions: Iterable[Partition]) -> dict[Partition, Progress]:
        events = open_table(self.settings, self.settings.table_uri(EVENTS))
        if events is None:
            return {}
        found = {}
        for where in partitions:
            end = events.transaction_version(app_id(where.topic, where.partition))
            if end is not None:
                found[where] = Progress(int(end))
        if found:
            log.info("progress of %d partitions taken from an earlier release's lake", len(found))
        return found

    @property
    def known(self) -> dict[Partition, Progress]:
        if self._known is None:
            self.read()
        assert self._known is not None
        return self._known

    def advance(self, ends: Mapping[Partition, tuple[int, str | None]]) -> None:
        """Record a landed batch's ends (never lowering an offset of the same topic)."""
        known = dict(self.known)
        changed = False
        for where, (end, last) in ends.items():
            before = known.get(where)
            topic_id = self.topic_ids.get(where.topic, before.topic_id if before else None)
            same_log = before is not None and before.topic_id in (None, topic_id)
            if same_log and before is not None and before.end_offset >= end:
                if before.topic_id is None and topic_id is not None:
                    known[where] = Progress(before.end_offset, topic_id, before.last_record)
                    changed = True
                continue
            known[where] = Progress(end, topic_id, last)
            changed = True
        if changed:
            self.replace(known)

    def forget_topic(self, topic: str, topic_id: str | None) -> None:
        """A topic read again from its start (another log): its partitions start over."""
        known = {where: p for where, p in self.known.items() if where.topic != topic}
        self.topic_ids[topic] = topic_id
        self.replace(known)

    def replace(self, progress: Mapping[Partition, Progress]) -> None:
        import pyarrow as pa
        from deltalake import write_deltalake

        now = datetime.now(UTC)
        rows = [
            {
                "topic": where.topic,
                "partition": where.partition,
                "end_offset": p.end_offset,
                "topic_id": p.topic_id,
                "last_record": p.last_record,
                "updated": now,
            }
            for where, p in sorted(progress.items())
        ]
        table = pa.Table.from_pylist(rows, schema=PROGRESS_TABLE.arrow_schema())
        write_deltalake(
            self.uri, table, mode="overwrite", storage_options=storage_options(self.settings)
        )
        self._known = dict(progress)
