"""The lake's sink: one micro-batch into the Delta tables, exactly once, with ``deltalake``.

For each micro-batch (``foreachBatch(df, batch_id)``):

1. Spark parses and validates every record on the executors (``mapInArrow`` with
   :func:`outbox_lake.records.parse_batch`): each record becomes an event row or a quarantine row
   with its reason; nothing a record holds can fail the batch;
2. the driver receives the parsed rows of that one batch in one Spark job (bounded by the
   source's admission control, by records and by bytes) and keeps, of the copies of an event
   met in the batch, the one with the lowest offset;
3. each table gets one insert-only merge keyed by event id (quarantine: by quarantine id),
   restricted to the batch's day partitions, so re-reading records for any reason (a replay
   after a crash, a deleted checkpoint, a second delivery path) adds nothing. Nothing is
   skipped on the strength of a batch id: a new checkpoint starts its ids at 0 again;
4. the typed tables, then ``quarantine``, then ``events``: when ``events`` has a batch, so
   does everything else. Each commit records the Kafka offsets it has taken in
   (:mod:`outbox_lake.progress`).

Tables: ``events``, ``quarantine``, and one ``aggregate_<type>`` per aggregate type
(:func:`typed_table_name`; the payload's top-level fields as columns, decided by
:mod:`outbox_lake.typed_rows`; a row that cannot be typed goes to quarantine with the reason and
its event stays in ``events``).
"""

from __future__ import annotations

import hashlib
import logging
import re
import time
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from deltalake.exceptions import CommitFailedError

from outbox_lake.delta_tables import columns_of, insert_new_rows, open_table
from outbox_lake.metrics import LakeMetrics
from outbox_lake.progress import Ends, batch_ends, forward_transactions
from outbox_lake.records import EVENT_COLUMNS, parsed_arrow_schema
from outbox_lake.settings import LakeSettings
from outbox_lake.typed_rows import TYPED_BASE, plan_typed_rows

__all__ = [
    "EVENTS",
    "EVENTS_SCHEMA",
    "QUARANTINE",
    "QUARANTINE_SCHEMA",
    "DeltaSink",
    "first_copies",
    "parsed_frame",
    "typed_table_name",
]

log = logging.getLogger("outbox.lake.sink")

EVENTS = "events"
QUARANTINE = "quarantine"
_TYPED_PREFIX = "aggregate_"
_COMMIT_ATTEMPTS = 5
_TYPED_BASE_NAMES = {name for name, _ in TYPED_BASE}
# What typing and a set-aside row need of each event (not its headers nor raw bytes).
_TYPING_COLUMNS = (
    *(name for name, _ in TYPED_BASE),
    *("payload", "topic", "partition", "offset", "ingest_time"),
)
_ROW = "__row"  # an event's index in the batch, to find its raw record again

_PARSED = parsed_arrow_schema()
_INGEST_TIME = pa.field("ingest_time", pa.timestamp("us", tz="UTC"))
EVENTS_SCHEMA = pa.schema([*(_PARSED.field(name) for name in EVENT_COLUMNS), _INGEST_TIME])
QUARANTINE_SCHEMA = pa.schema(
    [
        ("quarantine_id", pa.string()),
        ("target_table", pa.string()),
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("event_id", pa.string()),
        ("reason", pa.string()),
        ("ingest_time", pa.timestamp("us", tz="UTC")),
    ]
)


def typed_table_name(aggregate_type: str) -> str:
    """``aggregate_<type>``: one table per aggregate type, never shared.

    A type of lowercase letters, digits and single underscores keeps its name
    (``order`` → ``aggregate_order``). Any other type is reduced to those characters and
    given 8 hex digits of its SHA-256 after ``__``, a suffix no kept name can end with
    (``Order`` → ``aggregate_order__<hash>``, ``order.v2`` and ``order-v2`` apart). Each
    table also records its aggregate type (Delta metadata name): a collision is refused.
    """
    if re.fullmatch(r"[a-z0-9_]+", aggregate_type) and "__" not in aggregate_type:
        return _TYPED_PREFIX + aggregate_type
    reduced = re.sub(r"[^a-z0-9]+", "_", aggregate_type.lower()).strip("_")[:80] or "x"
    digest = hashlib.sha256(aggregate_type.encode("utf-8", "surrogatepass")).hexdigest()[:8]
    return f"{_TYPED_PREFIX}{reduced}__{digest}"


def parsed_frame(frame: Any) -> Any:
    """The micro-batch as parsed rows (``kind``: event or quarantine), stamped with their
    ingest time. Our source parses while it reads; rows of Spark's own Kafka source (raw
    Kafka columns) are parsed here, on the executors."""
    from pyspark.sql import functions as f

    from outbox_lake.records import PARSED_SCHEMA, parse_batch

    if "kind" not in frame.columns:
        frame = frame.mapInArrow(parse_batch, PARSED_SCHEMA)
    return frame.withColumn("ingest_time", f.current_timestamp())


def first_copies(events: pa.Table) -> pa.Table:
    """The events in offset order, each event id once: the copy with the lowest offset."""
    ordered = events.sort_by(
        [("topic", "ascending"), ("partition", "ascending"), ("offset", "ascending")]
    )
    seen: set[str] = set()
    keep = []
    for index, event_id in enumerate(ordered.column("event_id").to_pylist()):
        if event_id not in seen:
            seen.add(event_id)
            keep.append(index)
    return ordered if len(keep) == ordered.num_rows else ordered.take(keep)


class DeltaSink:
    """Writes parsed micro-batches to the lake tables; every write is idempotent."""

    def __init__(self, settings: LakeSettings, metrics: LakeMetrics | None = None) -> None:
        self.settings = settings
        self.metrics = metrics if metrics is not None else LakeMetrics()

    # -- the batch -------------------------------------------------------------------------

    def write_spark_batch(self, frame: Any, batch_id: int) -> None:
        """``foreachBatch`` body: parse in Spark (one job), then :meth:`write`."""
        started = time.monotonic()
        parsed = parsed_frame(frame).toArrow()
        self.metrics.stage_seconds.labels("read_parse").observe(time.monotonic() - started)
        is_event = pc.equal(parsed.column("kind"), "event")
        events = parsed.filter(is_event)
        quarantined = parsed.filter(pc.invert(is_event))
        self.write(
            batch_id,
            events=events if events.num_rows else None,
            quarantined=quarantined if quarantined.num_rows else None,
            ends=batch_ends(parsed),
        )
        self.metrics.batch_seconds.observe(time.monotonic() - started)

    def write(
        self,
        batch_id: int,
        *,
        events: pa.Table | None,
        quarantined: pa.Table | None,
        ends: Ends | None = None,
    ) -> None:
        """Land one parsed batch in every table it concerns.

        A commit that loses a race (``outbox lake maintain`` compacting the same table) is
        retried; the retry adds only what is not there yet.
        """
        if ends is None:
            ends = {}
            for part in (events, quarantined):
                for key, end in batch_ends(part).items():
                    ends[key] = max(ends.get(key, 0), end)
        for attempt in range(1, _COMMIT_ATTEMPTS + 1):
            try:
                self._write_once(events=events, quarantined=quarantined, ends=ends)
                self.metrics.batches.inc()
                self.metrics.completed_batches += 1
                self.metrics.last_batch_time.set_to_current_time()
                return
            except CommitFailedError as conflict:
                if attempt == _COMMIT_ATTEMPTS:
                    raise
                log.warning("batch %d: commit conflict, retrying: %s", batch_id, conflict)

    def _write_once(
        self, *, events: pa.Table | None, quarantined: pa.Table | None, ends: Ends
    ) -> None:
        set_aside: list[dict[str, Any]] = []
        offered = 0 if events is None else events.num_rows
        stage = self.metrics.stage_seconds
        if events is not None and events.num_rows:
            events = first_copies(events)
            with stage.labels("typed").time():
                for aggregate_type, rows in self._by_type(events).items():
                    set_aside += self._write_typed(aggregate_type, rows, ends)
                _with_raw_record(set_aside, events)
        records = [] if quarantined is None else quarantined.to_pylist()
        with stage.labels("quarantine").time():
            self._write_quarantine(records, set_aside, ends)
        if events is not None and events.num_rows:
            with stage.labels("events").time():
                landed = self._write_events(events, ends)
            self.metrics.events.inc(landed)
            self.metrics.duplicates.inc(max(0, offered - landed))
            newest = pc.max(events.column("event_time")).as_py()
            if newest is not None:
                self.metrics.saw_events(newest.timestamp())

    @staticmethod
    def _by_type(events: pa.Table) -> dict[str, list[dict[str, Any]]]:
        """The events as Python rows per aggregate type, with only the columns typing needs
        (the record's raw bytes, the largest, are added back to the rows set aside)."""
        wanted = [name for name in _TYPING_COLUMNS if name in events.column_names]
        slim = events.select(wanted).append_column(_ROW, pa.array(range(events.num_rows)))
        grouped: dict[str, list[dict[str, Any]]] = {}
        for row in slim.to_pylist():
            grouped.setdefault(row["aggregate_type"], []).append(row)
        return grouped

    # -- the tables ------------------------------------------------------------------------

    def _write_events(self, events: pa.Table, ends: Ends) -> int:
        uri = self.settings.table_uri(EVENTS)
        table = open_table(uri)
        rows = events.select(EVENTS_SCHEMA.names).cast(EVENTS_SCHEMA)
        return insert_new_rows(
            uri,
            table,
            rows,
            key="event_id",
            transactions=forward_transactions(table, ends),
            by_day=True,
        )

    def _write_typed(
        self, aggregate_type: str, events: list[dict[str, Any]], ends: Ends
    ) -> list[dict[str, Any]]:
        """Write the typed rows of one aggregate type; return the rows set aside instead."""
        name = typed_table_name(aggregate_type)
        uri = self.settings.table_uri(name)
        table = open_table(uri)
        existing: dict[str, pa.DataType] = {}
        if table is not None:
            owner = table.metadata().name
            if owner and owner != aggregate_type:
                reason = (
                    f"the typed table {name} holds aggregate type {owner!r}, not "
                    f"{aggregate_type!r}: the event is in events; report this name collision"
                )
                return [{**event, "target_table": name, "reason": reason} for event in events]
            existing = {
                column: kind
                for column, kind in columns_of(table).items()
                if column not in _TYPED_BASE_NAMES
            }
        plan = plan_typed_rows(events, existing, name)
        set_aside = [
            {**event, "target_table": name, "reason": reason} for event, reason in plan.rejected
        ]
        for row in set_aside:
            log.warning("event %s: typed row to quarantine: %s", row["event_id"], row["reason"])
        if plan.rows:
            insert_new_rows(
                uri,
                table,
                plan.table(),
                key="event_id",
                transactions=forward_transactions(table, ends),
                by_day=True,
                owner=aggregate_type,
            )
        return set_aside

    def _write_quarantine(
        self, records: list[dict[str, Any]], set_aside: list[dict[str, Any]], ends: Ends
    ) -> None:
        rows = [_quarantine_row(row, EVENTS) for row in records] + [
            _quarantine_row(row, row["target_table"]) for row in set_aside
        ]
        if not rows:
            return
        self.metrics.quarantined.labels("record").inc(len(records))
        self.metrics.quarantined.labels("typed").inc(len(set_aside))
        uri = self.settings.table_uri(QUARANTINE)
        table = open_table(uri)
        insert_new_rows(
            uri,
            table,
            pa.Table.from_pylist(rows, schema=QUARANTINE_SCHEMA),
            key="quarantine_id",
            transactions=forward_transactions(table, ends),
            by_day=False,
        )


def _with_raw_record(set_aside: list[dict[str, Any]], events: pa.Table) -> None:
    """Give each typed row set aside its record's raw key and value (for quarantine)."""
    if not set_aside or "raw_value" not in events.column_names:
        return
    keys, values = events.column("raw_key"), events.column("raw_value")
    for row in set_aside:
        index = row.pop(_ROW)
        row["raw_key"], row["raw_value"] = keys[index].as_py(), values[index].as_py()


def _quarantine_row(row: dict[str, Any], target_table: str) -> dict[str, Any]:
    """A quarantine row; its id is the same whenever the same record is set aside again."""
    if target_table == EVENTS:
        digest = hashlib.sha256()
        for part in (row.get("raw_key"), row.get("raw_value")):
            digest.update(b"-" if part is None else b"+%d:" % len(part) + part)
        identity = f"{row['topic']}:{row['partition']}:{row['offset']}:{digest.hexdigest()[:32]}"
    else:
        identity = f"{target_table}:{row['event_id']}"
    return {
        "quarantine_id": identity,
        "target_table": target_table,
        "topic": row["topic"],
        "partition": row["partition"],
        "offset": row["offset"],
        "key": row.get("raw_key"),
        "value": row.get("raw_value"),
        "event_id": row.get("event_id"),
        "reason": row["reason"],
        "ingest_time": row.get("ingest_time"),
    }
