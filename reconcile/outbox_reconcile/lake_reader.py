"""Reads the lake's ``events``, typed tables and ``quarantine`` (``deltalake``, streamed).

Order matters, and follows the job's: a batch writes ``quarantine``, then ``events`` in one
commit that also holds the lake's progress (lake/outbox_lake/progress.py); the typed query
then types ``events`` into the typed tables, and the lake's progress says up to which
``events`` version they hold every row (``typed_through``). So ``events`` is read at one
version with the progress of that version, then ``quarantine`` and the typed tables, which
hold at least what that progress says; only the ``events`` rows of files already in the
version the typed tables have reached are judged for their typed row. A batch landing while
reconcile reads is never mistaken for a missing row.

Only the columns needed are read, in Arrow batches of 64k rows, pruned to the window's days
(``event_date`` partitions).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pyarrow.dataset as ds
from deltalake import DeltaTable

from outbox_lake.names import typed_table_name
from outbox_lake.offsets import Partition
from outbox_lake.progress import latest_progress
from outbox_lake.query import arrow_dataset
from outbox_lake.settings import LakeSettings
from outbox_lake.storage import open_table
from outbox_lake.tables import EVENTS, QUARANTINE
from outbox_lake.upgrade import earlier_progress
from outbox_reconcile.evidence import Evidence
from outbox_reconcile.records import TOPIC_PREFIX, Window

__all__ = ["LakeRead", "read_lake"]

_BATCH_ROWS = 8_192
_EVENT_COLUMNS = [
    "event_id",
    "aggregate_type",
    "aggregate_id",
    "position",
    "topic",
    "partition",
    "offset",
]


@dataclass
class LakeRead:
    events_version: int | None = None
    rows: int = 0
    aggregate_types: set[str] = field(default_factory=set)
    typed_tables: dict[str, int] = field(default_factory=dict)
    """{typed table: its version} (-1: the table does not exist)"""


def _in_window(window: Window) -> Any:
    """A filter on ``event_date`` (partition pruning) and ``event_time``, or None."""
    condition = None
    for bound, compare in ((window.since, "ge"), (window.until, "lt")):
        if bound is None:
            continue
        moment = bound.astimezone(UTC)
        day = (
            ds.field("event_date") >= moment.date()
            if compare == "ge"
            else (ds.field("event_date") <= moment.date())
        )
        time = (
            ds.field("event_time") >= moment
            if compare == "ge"
            else (ds.field("event_time") < moment)
        )
        part = day & time
        condition = part if condition is None else condition & part
    return condition


def _batches(table: DeltaTable, columns: list[str], window: Window) -> Iterator[Any]:
    dataset = arrow_dataset(table)
    # Little read-ahead: memory follows one file's columns, not the table.
    yield from dataset.to_batches(
        columns=columns,
        filter=_in_window(window),
        batch_size=_BATCH_ROWS,
        batch_readahead=1,
        fragment_readahead=1,
    )


def _typed_due(settings: LakeSettings, typed_through: int | None) -> set[str]:
    """The ``events`` files whose rows the typed tables hold all of (their version's)."""
    if typed_through is None:
        return set()
    table = open_table(settings, settings.table_uri(EVENTS), version=typed_through)
    if table is None:
        return set()
    return {_relative(table, uri) for uri in table.file_uris()}


def _relative(table: DeltaTable, uri: str) -> str:
    """A data file's path within its table (as the table's dataset names its fragments)."""
    root = table.table_uri.rstrip("/")
    for prefix in (root, root.removeprefix("file://")):
        if uri.startswith(prefix + "/"):
            return uri[len(prefix) + 1 :]
    return uri


def _file_batches(
    table: DeltaTable, columns: list[str], window: Window, due: set[str]
) -> Iterator[tuple[Any, bool]]:
    """Each file's rows in Arrow batches, with whether the file is in ``due``."""
    dataset = arrow_dataset(table)
    condition = _in_window(window)
    for fragment in dataset.get_fragments(filter=condition):
        # Little read-ahead: memory follows one file's columns, not the table.
        scanner = ds.Scanner.from_fragment(  # the dataset's schema: its partition columns too
            fragment,
            schema=dataset.schema,
            columns=columns,
            filter=condition,
            batch_size=_BATCH_ROWS,
            batch_readahead=1,
        )
        for batch in scanner.to_batches():
            yield batch, str(fragment.path) in due


def read_lake(
    settings: LakeSettings,
    evidence: Evidence,
    window: Window,
    partitions: Iterable[tuple[str, int]],
    advance: Callable[[int], None] = lambda _: None,
) -> LakeRead:
    read = LakeRead()
    wanted = [Partition(topic, partition) for topic, partition in partitions]
    # The progress first, then events: read at its latest version, events holds at least
    # what the progress says (deltalake's history is the newest on storage, whatever
    # version a table object was loaded at).
    progress = latest_progress(open_table(settings, settings.table_uri(EVENTS)))
    progress = progress or earlier_progress(settings, lambda: wanted)
    events = open_table(settings, settings.table_uri(EVENTS))
    if events is not None:
        read.events_version = events.version()
        known = progress.partitions
        for where in wanted:
            if where in known:
                evidence.set_lake_progress(where.topic, where.partition, known[where].end_offset)
        typed_due = _typed_due(settings, progress.typed_through)
        for batch, due in _file_batches(events, _EVENT_COLUMNS, window, typed_due):
            columns = [batch.column(name).to_pylist() for name in _EVENT_COLUMNS]
            types = columns[1]
            read.aggregate_types.update(types)
            names = {kind: typed_table_name(kind) if due else None for kind in set(types)}
            read.rows += evidence.add_lake(
                (*row, names[row[1]]) for row in zip(*columns, strict=True)
            )
            advance(batch.num_rows)
    quarantine = open_table(settings, settings.table_uri(QUARANTINE))
    if quarantine is not None:
        for batch in _batches(quarantine, _QUARANTINE_COLUMNS, Window()):
            evidence.add_quarantine(_quarantine_rows(batch, window))
            advance(batch.num_rows)
    for aggregate_type in sorted(read.aggregate_types):
        name = typed_table_name(aggregate_type)
        typed = open_table(settings, settings.table_uri(name))
        read.typed_tables[name] = -1 if typed is None else typed.version()
        if typed is None:
            continue
        for batch in _batches(typed, ["event_id"], window):
            evidence.add_typed(aggregate_type, name, batch.column("event_id").to_pylist())
            advance(batch.num_rows)
    return read


_QUARANTINE_COLUMNS = [
    "target_table",
    "topic",
    "partition",
    "offset",
    "event_id",
    "reason",
    "ingest_time",
]


def _quarantine_rows(batch: Any, window: Window) -> Iterator[tuple[Any, ...]]:
    """Quarantine rows with their aggregate type (from the topic) and whether they are in
    the window: by their event id's time, or, without an id, by when they were set aside."""
    columns = [batch.column(name).to_pylist() for name in _QUARANTINE_COLUMNS]
    for target, topic, partition, offset, event_id, reason, ingested in zip(*columns, strict=True):
        if event_id:
            inside = window.holds(event_id)
        else:
            moment = ingested or datetime.fromtimestamp(0, UTC)
            inside = window.holds_ms(int(moment.timestamp() * 1000))
        yield (
            str(topic).removeprefix(TOPIC_PREFIX),
            target,
            topic,
            partition,
            offset,
            event_id,
            reason,
            inside,
        )
