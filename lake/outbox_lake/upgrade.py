"""Everything about lakes written by earlier releases, in one place.

Goes when no supported lake predates the release that keeps progress in ``events``' commits
(the release after 2026-11-28's; docs/upgrading.md, "The lake"): then ``earlier_progress``
reads ``events`` only, and the two moves below go.

- **Progress** (:func:`earlier_progress`): this release keeps it in each ``events`` commit
  (:mod:`outbox_lake.progress`). Before, it was a ``_progress`` table (one row per
  partition), and before that Delta application transactions of ``events``
  (``outbox-lake:<topic>:<partition>``, version = the offset after the last record). Either
  is read when ``events`` holds no progress of ours yet; the first batch of this release
  records it in ``events`` and ``_progress`` is left as it was (``outbox lake maintain``
  may delete it afterwards: nothing reads it once ``events`` holds progress).
- **A checkpoint of our old Python source** (:func:`move_aside_earlier_checkpoint`):
  Spark's Kafka source cannot read its offsets; it is moved aside and the query starts where
  the lake's progress says; its topic ids are kept.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from outbox_lake.offsets import Partition, Progress
from outbox_lake.progress import LakeProgress, latest_progress
from outbox_lake.settings import LakeSettings
from outbox_lake.storage import move_aside, open_table
from outbox_lake.tables import EVENTS, PROGRESS

if TYPE_CHECKING:
    from deltalake import DeltaTable

__all__ = ["LEGACY_APP_PREFIX", "earlier_progress", "move_aside_earlier_checkpoint"]

log = logging.getLogger("outbox.lake.upgrade")

LEGACY_APP_PREFIX = "outbox-lake"
"""Application transactions of the release before ``_progress``: ``outbox-lake:<t>:<p>``."""

_ids_from_checkpoint: dict[str, str] = {}


def earlier_progress(
    settings: LakeSettings, partitions: Callable[[], Iterable[Partition]]
) -> LakeProgress:
    """The lake's progress: from ``events``' commits, else from what an earlier release
    kept (``_progress``, then application transactions of ``events`` for the broker's
    ``partitions()``), else none."""
    events = open_table(settings, settings.table_uri(EVENTS))
    found = latest_progress(events)
    if found is not None:
        return _with_checkpoint_ids(found)
    table = open_table(settings, settings.table_uri(PROGRESS))
    if table is not None:
        rows = table.to_pyarrow_table().to_pylist()
        log.info("progress of %d partitions taken from an earlier release's _progress", len(rows))
        return _with_checkpoint_ids(
            LakeProgress(
                {
                    Partition(row["topic"], int(row["partition"])): Progress(
                        int(row["end_offset"]), row["topic_id"], row["last_record"]
                    )
                    for row in rows
                }
            )
        )
    if events is not None:
        versions = _app_transactions(events, partitions())
        if versions:
            log.info(
                "progress of %d partitions taken from an earlier release's lake", len(versions)
            )
            return _with_checkpoint_ids(LakeProgress(versions))
    return _with_checkpoint_ids(LakeProgress())


def _app_transactions(
    events: DeltaTable, partitions: Iterable[Partition]
) -> dict[Partition, Progress]:
    """``outbox-lake:<topic>:<partition>`` application transactions of ``events``."""
    found: dict[Partition, Progress] = {}
    for where in partitions:
        version = events.transaction_version(f"{LEGACY_APP_PREFIX}:{where.topic}:{where.partition}")
        if version is not None:
            found[where] = Progress(int(version))
    return found


def _with_checkpoint_ids(progress: LakeProgress) -> LakeProgress:
    if not _ids_from_checkpoint:
        return progress
    return LakeProgress(
        {
            where: Progress(
                p.end_offset, p.topic_id or _ids_from_checkpoint.get(where.topic), p.last_record
            )
            for where, p in progress.partitions.items()
        },
        progress.typed_through,
    )


def move_aside_earlier_checkpoint(settings: LakeSettings) -> None:
    """A checkpoint of an earlier release's Python source: moved aside, its topics' ids kept
    for :func:`earlier_progress`. Spark's Kafka source cannot read its offsets."""
    if not settings.is_local:
        return
    folder = Path(settings.checkpoint)
    offsets = folder / "offsets"
    if not offsets.is_dir() or (folder / "sources" / "0" / "0").exists():
        return
    numbered = [f for f in offsets.iterdir() if f.name.isdigit()]
    if numbered:
        last = max(numbered, key=lambda f: int(f.name))
        try:
            kept = json.loads(last.read_text().splitlines()[-1])
            ids = {str(k): str(v) for k, v in (kept.get("@topic_ids") or {}).items()}
            _ids_from_checkpoint.update(ids)
        except (ValueError, IndexError, AttributeError):
            pass
    aside = move_aside(folder, "python-source")
    log.warning(
        "the checkpoint %s was written by an earlier release's Kafka source: moved to %s; "
        "the job starts where the lake's tables stand",
        folder,
        aside,
    )
