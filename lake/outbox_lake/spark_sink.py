"""The lake's sink: one micro-batch into the Delta tables with Delta's Spark writer, exactly once,
every row written by the executors.

For each micro-batch (``foreachBatch(frame, batch_id)`` over Spark's Kafka source):

1. the executors parse and validate every record (``mapInArrow`` with
   :func:`outbox_lake.records.parse_batch`): an event row or a quarantine row with its reason;
   nothing a record holds can fail the batch. Of the copies of an event met in the batch, the
   one with the lowest offset is kept;
2. the driver asks Spark for the batch's shape only (one small aggregate: per aggregate type
   its days, its event-id range and the first kind of each payload field; per partition its
   last offset and that record's fingerprint), reads each typed table's columns from its Delta
   log, and decides each typed table's columns for the batch;
3. each table gets one insert-only ``MERGE`` keyed by event id (quarantine: quarantine id),
   restricted to the batch's days and id range: the typed tables (each row typed on the
   executors against the decided columns, or set aside with the reason), then ``quarantine``,
   then ``events``. Re-reading records for any reason (a replay after a crash, a deleted
   checkpoint, a second delivery path) adds nothing; nothing is skipped on a batch id;
4. then ``_progress`` (:mod:`outbox_lake.progress`) moves forward: what it says is in every
   table.

Tables are created by ``deltalake`` (protocol 1/2, no table feature: every reader reads
them, and the typed tables record their aggregate type as the Delta metadata name); Delta's
Spark writer then merges into them, adding columns as payloads bring new fields.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import date
from typing import Any

from outbox.core.lake_contract import DECIMAL_TYPE
from outbox_lake.metrics import LakeMetrics
from outbox_lake.names import typed_table_name
from outbox_lake.offsets import Partition
from outbox_lake.progress import ProgressStore
from outbox_lake.records import (
    PARSED_SCHEMA,
    TYPING_RECURSION_LIMIT,
    parse_batch,
    recursion_limit,
)
from outbox_lake.settings import LakeSettings
from outbox_lake.storage import is_table, open_table, storage_options
from outbox_lake.tables import EVENTS_TABLE, QUARANTINE_TABLE, TYPED_BASE, Table
from outbox_lake.typed_rows import type_batch, typed_batch_schema

__all__ = ["BatchShape", "SparkDeltaSink", "decide_columns"]

log = logging.getLogger("outbox.lake.sink")

_COMMIT_ATTEMPTS = 5
_TYPED_BASE_NAMES = {column.name for column in TYPED_BASE}
_DELTA_KINDS = {
    "string": "string",
    "long": "long",
    "integer": "long",
    "short": "long",
    "byte": "long",
    "double": "double",
    "float": "double",
    "boolean": "boolean",
    DECIMAL_TYPE: "decimal",
}


@dataclass
class TypeShape:
    """One aggregate type's part of a batch."""

    days: set[date] = field(default_factory=set)
    low: str | None = None
    high: str | None = None
    fields: list[tuple[tuple[str, int, int], str, str]] = field(default_factory=list)
    """(first (topic, partition, offset), name, kind) of each payload field met."""


@dataclass
class BatchShape:
    """What the driver knows of a batch: no row, only its shape."""

    types: dict[str, TypeShape] = field(default_factory=dict)
    ends: dict[Partition, tuple[int, str | None]] = field(default_factory=dict)
    """{partition: (offset after its last record, that record's fingerprint)}"""
    starts: dict[Partition, int] = field(default_factory=dict)
    """{partition: its first record's offset in the batch}"""
    events: int = 0
    quarantined: int = 0
    newest_event_time: float | None = None


def decide_columns(existing: dict[str, str], met: Iterable[tuple[Any, str, str]]) -> dict[str, str]:
    """A typed table's payload columns for a batch: those it has, then each new field in the
    order of the record that first brought it (its kind decided by that record). A field that
    differs only in case from a column, or from a field met earlier, gets no column (its rows
    are set aside with the reason)."""
    columns = dict(existing)
    taken = {name.lower() for name in (*existing, *_TYPED_BASE_NAMES)}
    for _, name, kind in sorted(met, key=lambda item: item[0]):
        if name.lower() in taken:
            continue
        taken.add(name.lower())
        columns[name] = kind
    return columns


class SparkDeltaSink:
    """Writes micro-batches of Spark's Kafka source to the lake tables; idempotent."""

    def __init__(
        self,
        settings: LakeSettings,
        metrics: LakeMetrics | None = None,
        progress: ProgressStore | None = None,
        before_write: Callable[[Any, BatchShape], None] | None = None,
    ) -> None:
        self.settings = settings
        self.metrics = metrics if metrics is not None else LakeMetrics()
        self.progress = progress if progress is not None else ProgressStore(settings)
        self.before_write = before_write
        self._rejected: Any = None
        self._collisions = 0
        """Called with the batch's shape before anything is written (the job's data-loss
        check): it may raise to refuse the batch."""

    # -- the batch -------------------------------------------------------------------------

    def write_batch(self, frame: Any, batch_id: int) -> None:
        """``foreachBatch`` body."""
        started = time.monotonic()
        spark = frame.sparkSession
        parsed = parsed_frame(frame).persist()
        timings: dict[str, float] = {}
        try:
            with _timed(self.metrics, "read_parse", timings):
                shape = batch_shape(parsed)
            if not shape.ends:
                return
            if self.before_write is not None:
                self.before_write(spark, shape)
            self._write(spark, parsed, shape, batch_id, timings)
        finally:
            parsed.unpersist()
        took = time.monotonic() - started
        self.metrics.batches.inc()
        self.metrics.completed_batches += 1
        self.metrics.last_batch_time.set_to_current_time()
        self.metrics.batch_seconds.observe(took)
        log.info(
            "batch %d: %d events, %d records set aside, %.2f s (%s)",
            batch_id,
            shape.events,
            shape.quarantined,
            took,
            ", ".join(f"{stage} {seconds:.2f}" for stage, seconds in timings.items()),
        )

    def _write(
        self, spark: Any, parsed: Any, shape: BatchShape, batch_id: int, timings: dict[str, float]
    ) -> None:
        from pyspark.sql import functions as f

        events = first_copies(parsed.filter(f.col("kind") == "event")).persist()
        self._rejected = spark.sparkContext.accumulator(0)
        self._collisions = 0  # typed tables of another aggregate type met in this batch
        set_aside = []
        typed_frames = []
        try:
            with _timed(self.metrics, "typed", timings):
                for aggregate_type, part in sorted(shape.types.items()):
                    frame = self._write_typed(spark, events, aggregate_type, part, batch_id)
                    if frame is not None:
                        typed_frames.append(frame)
                        set_aside.append(frame.filter(f.col("_reason").isNotNull()))
            # Typed rows set aside, counted on the executors while they typed (at least once).
            typed_aside = int(self._rejected.value) + self._collisions
            if shape.quarantined or typed_aside:
                with _timed(self.metrics, "quarantine", timings):
                    self._write_quarantine(spark, parsed, set_aside, batch_id)
                self.metrics.quarantined.labels("record").inc(shape.quarantined)
                self.metrics.quarantined.labels("typed").inc(int(self._rejected.value))
            if shape.events:
                with _timed(self.metrics, "events", timings):
                    rows = events.withColumn("ingest_time", f.current_timestamp())
                    self._merge(
                        spark,
                        EVENTS_TABLE,
                        self.settings.table_uri(EVENTS_TABLE.name),
                        rows.select(*EVENTS_TABLE.names),
                        days=set().union(*(t.days for t in shape.types.values())),
                        ids=_id_range(shape),
                        batch_id=batch_id,
                    )
                landed = _rows_inserted(self.settings, self.settings.table_uri(EVENTS_TABLE.name))
                if landed is None:
                    landed = shape.events
                self.metrics.events.inc(landed)
                self.metrics.duplicates.inc(max(0, shape.events - landed))
                if shape.newest_event_time is not None:
                    self.metrics.saw_events(shape.newest_event_time)
        finally:
            for frame in typed_frames:
                frame.unpersist()
            events.unpersist()
        with _timed(self.metrics, "progress", timings):
            self.progress.advance(shape.ends)

    def _write_typed(
        self, spark: Any, events: Any, aggregate_type: str, part: TypeShape, batch_id: int
    ) -> Any:
        """Type one aggregate type's events on the executors and merge the typed rows; the
        typed frame (persisted; its ``_reason`` rows go to quarantine)."""
        from pyspark.sql import functions as f

        name = typed_table_name(aggregate_type)
        uri = self.settings.table_uri(name)
        owner, existing = _table_columns(self.settings, uri)
        mine = events.filter(f.col("aggregate_type") == aggregate_type)
        if owner is not None and owner != aggregate_type:
            self._collisions += 1
            reason = (
                f"the typed table {name} holds aggregate type {owner!r}, not "
                f"{aggregate_type!r}: the event is in events; report this name collision"
            )
            return mine.select(
                f.col("event_id"),
                f.lit(reason).alias("_reason"),
                f.col("topic").alias("_topic"),
                f.col("partition").alias("_partition"),
                f.col("offset").alias("_offset"),
                f.col("raw_key").alias("_key"),
                f.col("raw_value").alias("_value"),
                f.lit(name).alias("_table"),
            ).persist()
        columns = decide_columns(existing, part.fields)
        schema = typed_batch_schema(columns)
        rejected = self._rejected

        def typing(batches: Iterable[Any]) -> Iterator[Any]:
            for batch in batches:
                with recursion_limit(TYPING_RECURSION_LIMIT):
                    typed = type_batch(batch.to_pylist(), columns, name)
                rejected.add(typed.num_rows - typed.column("_reason").null_count)
                yield typed

        from pyspark.sql.pandas.types import from_arrow_schema

        typed = (
            mine.mapInArrow(typing, from_arrow_schema(schema))
            .withColumn("_table", f.lit(name))
            .persist()
        )
        if owner is None:
            _create_table(
                self.settings, uri, _typed_arrow_schema(schema), by_day=True, owner=aggregate_type
            )
        rows = typed.filter(f.col("_reason").isNull()).drop(
            "_reason", "_topic", "_partition", "_offset", "_key", "_value", "_table"
        )
        self._merge(
            spark,
            None,
            uri,
            rows,
            days=part.days,
            ids=(part.low, part.high),
            batch_id=batch_id,
        )
        return typed

    def _write_quarantine(
        self, spark: Any, parsed: Any, set_aside: list[Any], batch_id: int
    ) -> None:
        from pyspark.sql import functions as f

        now = f.current_timestamp()
        records = parsed.filter(f.col("kind") == "quarantine").select(
            "quarantine_id",
            f.lit(EVENTS_TABLE.name).alias("target_table"),
            "topic",
            "partition",
            "offset",
            f.col("raw_key").alias("key"),
            f.col("raw_value").alias("value"),
            "event_id",
            "reason",
            now.alias("ingest_time"),
        )
        frames = [records]
        for frame in set_aside:
            frames.append(
                frame.select(
                    f.concat_ws(":", f.col("_table"), f.col("event_id")).alias("quarantine_id"),
                    f.col("_table").alias("target_table"),
                    f.col("_topic").alias("topic"),
                    f.col("_partition").alias("partition"),
                    f.col("_offset").alias("offset"),
                    f.col("_key").alias("key"),
                    f.col("_value").alias("value"),
                    "event_id",
                    f.col("_reason").alias("reason"),
                    now.alias("ingest_time"),
                )
            )
        rows = frames[0]
        for frame in frames[1:]:
            rows = rows.unionByName(frame)
        self._merge(
            spark,
            QUARANTINE_TABLE,
            self.settings.table_uri(QUARANTINE_TABLE.name),
            rows,
            days=set(),
            ids=(None, None),
            batch_id=batch_id,
        )

    # -- the one way a table is written ----------------------------------------------------

    def _merge(
        self,
        spark: Any,
        table: Table | None,
        uri: str,
        rows: Any,
        *,
        days: set[date],
        ids: tuple[str | None, str | None],
        batch_id: int,
    ) -> None:
        """Insert the rows whose key the table lacks (creating the table first)."""
        from delta.tables import DeltaTable

        key = "event_id" if table is None else table.key
        by_day = True if table is None else table.by_day
        if table is not None and not is_table(self.settings, uri):
            _create_table(self.settings, uri, table.arrow_schema(), by_day=by_day, owner=None)
        condition = f"t.`{key}` = s.`{key}`"
        low, high = ids
        if key == "event_id" and _is_uuid(low) and _is_uuid(high):  # safe literals only
            condition = f"t.event_id >= '{low}' AND t.event_id <= '{high}' AND {condition}"
        if by_day:
            if not days:
                return
            in_days = ", ".join(f"DATE'{day.isoformat()}'" for day in sorted(days))
            condition = (
                f"t.event_date IN ({in_days}) AND t.event_date = s.event_date AND {condition}"
            )
        for attempt in range(1, _COMMIT_ATTEMPTS + 1):
            try:
                (
                    DeltaTable.forPath(spark, uri)
                    .alias("t")
                    .merge(rows.alias("s"), condition)
                    .whenNotMatchedInsertAll()
                    .withSchemaEvolution()
                    .execute()
                )
                return
            except Exception as error:
                if (
                    attempt == _COMMIT_ATTEMPTS
                    or "Concurrent" not in type(error).__name__ + str(error)[:300]
                ):
                    raise
                log.warning("batch %d: commit conflict on %s, retrying: %s", batch_id, uri, error)


# -- the batch's rows and shape ------------------------------------------------------------------


@contextlib.contextmanager
def _timed(metrics: LakeMetrics, stage: str, timings: dict[str, float]) -> Iterator[None]:
    started = time.monotonic()
    try:
        yield
    finally:
        took = time.monotonic() - started
        timings[stage] = timings.get(stage, 0.0) + took
        metrics.stage_seconds.labels(stage).observe(took)


def parsed_frame(frame: Any) -> Any:
    """The micro-batch as parsed rows (``kind``: event or quarantine), on the executors."""
    return frame.select(
        "key", "value", "topic", "partition", "offset", "timestamp", "headers"
    ).mapInArrow(parse_batch, PARSED_SCHEMA)


def first_copies(events: Any) -> Any:
    """Each event id once: the copy with the lowest (topic, partition, offset)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as f

    order = Window.partitionBy("event_id").orderBy("topic", "partition", "offset")
    return events.withColumn("_n", f.row_number().over(order)).filter("_n = 1").drop("_n")


def batch_shape(parsed: Any) -> BatchShape:
    """One Spark job; only the batch's shape reaches the driver."""
    from pyspark.sql import functions as f

    where = f.struct("topic", "partition", "offset")
    is_event = f.col("kind") == "event"
    per_type = (
        parsed.filter(is_event)
        .select(
            "aggregate_type",
            "event_id",
            "event_date",
            "event_time",
            where.alias("at"),
            f.explode_outer("fields").alias("field"),
        )
        .groupBy("aggregate_type", f.lower(f.col("field.name")).alias("lname"), "field.kind")
        .agg(
            f.min("at").alias("first"),
            f.min("event_id").alias("low"),
            f.max("event_id").alias("high"),
            f.collect_set("event_date").alias("days"),
            f.max("event_time").alias("newest"),
            f.min_by("field.name", "at").alias("name"),
        )
        .withColumn("part", f.lit("t"))
    )
    per_partition = (
        parsed.groupBy("topic", "partition")
        .agg(
            f.max("offset").alias("last"),
            f.min("offset").alias("first_offset"),
            f.max_by("fingerprint", "offset").alias("fingerprint"),
            f.count_if(is_event).alias("events"),
            f.count_if(~is_event).alias("quarantined"),
        )
        .select(
            f.lit("p").alias("part"),
            f.col("topic").alias("aggregate_type"),
            "partition",
            (f.col("last") + 1).alias("end"),
            "first_offset",
            "fingerprint",
            "events",
            "quarantined",
        )
    )
    shape = BatchShape()
    rows = per_type.unionByName(per_partition, allowMissingColumns=True).collect()
    for row in rows:
        if row["part"] == "p":
            where_ = Partition(row["aggregate_type"], int(row["partition"]))
            shape.ends[where_] = (int(row["end"]), row["fingerprint"])
            shape.starts[where_] = int(row["first_offset"])
            shape.quarantined += int(row["quarantined"])
            shape.events += int(row["events"])
            continue
        part = shape.types.setdefault(row["aggregate_type"], TypeShape())
        part.days.update(row["days"] or ())
        part.low = min(filter(None, (part.low, row["low"])), default=None)
        part.high = max(filter(None, (part.high, row["high"])), default=None)
        if row["name"] is not None:
            first = row["first"]
            part.fields.append(
                ((first["topic"], first["partition"], first["offset"]), row["name"], row["kind"])
            )
        if row["newest"] is not None:
            newest = row["newest"].timestamp()
            shape.newest_event_time = max(shape.newest_event_time or newest, newest)
    return shape


def _id_range(shape: BatchShape) -> tuple[str | None, str | None]:
    lows = [t.low for t in shape.types.values() if t.low]
    highs = [t.high for t in shape.types.values() if t.high]
    return (min(lows) if lows else None, max(highs) if highs else None)


# -- tables (their logs, on the driver: metadata only) ------------------------------------------


def _table_columns(settings: LakeSettings, uri: str) -> tuple[str | None, dict[str, str]]:
    """(the table's metadata name, its payload columns: name → kind); (None, {}) when there
    is no table yet."""
    table = open_table(settings, uri)
    if table is None:
        return None, {}
    columns: dict[str, str] = {}
    for column in table.schema().fields:
        if column.name in _TYPED_BASE_NAMES:
            continue
        kind = getattr(column.type, "type", None)
        columns[column.name] = _DELTA_KINDS.get(str(kind), "string")
    return table.metadata().name or "", columns


def _rows_inserted(settings: LakeSettings, uri: str) -> int | None:
    """The rows the table's last commit inserted (its MERGE's own count), when it says."""
    try:
        table = open_table(settings, uri)
        if table is None:
            return None
        last = table.history(1)[0]
        inserted = (last.get("operationMetrics") or {}).get("numTargetRowsInserted")
        return None if inserted is None else int(inserted)
    except Exception:  # a metric must never fail a batch
        return None


def _typed_arrow_schema(schema: Any) -> Any:
    import pyarrow as pa

    return pa.schema([field for field in schema if not field.name.startswith("_")])


def _create_table(
    settings: LakeSettings, uri: str, schema: Any, *, by_day: bool, owner: str | None
) -> None:
    """Create an empty table (``deltalake``: reader 1 / writer 2, no table feature; on object
    storage a conditional write of version 0, before Spark's writer ever touches the table)."""
    from deltalake import DeltaTable

    try:
        DeltaTable.create(
            uri,
            schema=schema,
            partition_by=["event_date"] if by_day else None,
            name=owner,
            mode="ignore",
            storage_options=storage_options(settings),
        )
    except Exception as error:
        if not is_table(settings, uri):
            raise
        log.info("table %s created meanwhile: %s", uri, error)


def _is_uuid(value: str | None) -> bool:
    import re

    return value is not None and bool(
        re.fullmatch(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", value)
    )
