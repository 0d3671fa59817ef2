"""Typed tables, off the freshness path: a second streaming query reads ``events`` (Delta's
streaming source) and types each new event into ``aggregate_<type>``.

``events`` is the lake's freshness path and its truth (:mod:`outbox_lake.landing`); the
typed tables are derived from it and trail it by about one trigger of this query. For each
micro-batch of new ``events`` rows, each aggregate type's rows land on one of two paths, as
``events`` lands its batches (the batch's types are observed by the write of the first type
tried, one of the batch before; a small job of their own otherwise):

- **one job** (the common case: the table exists, every row's fields are columns of it):
  the rows are typed on the executors (in the JVM where it can: :mod:`outbox_lake.spark_typing`;
  by the Python rules, :mod:`outbox_lake.typed_rows`, otherwise) and their files written
  through Delta's transaction API (nothing visible yet) while the rows pending (a field the
  table lacks) or set aside are counted on the way; the driver reads the written ids back,
  looks them up in the table within their ranges, and commits the files. While the Kafka
  query runs beside this one, the rows are typed and written by one task, so that the
  freshness path always has a core;
- **two jobs** (a new table, a new field, a row set aside, a copy landed before): the files
  of the first attempt are deleted uncommitted, and

  1. the executors list each payload's top-level fields and their kinds (Python, the one
     definition of the typing rules); the driver gets, per aggregate type, each field's
     first appearance (in offset order), the types' days and event-id ranges, and decides
     each typed table's columns for the batch (:func:`decide_columns`);
  2. per aggregate type, the executors type every row against those columns, or set it
     aside with the reason; the typed rows whose event id the table lacks (read on the
     driver within the batch's id ranges, as ``events`` is) are appended in one commit, new
     columns added (schema evolution); a ``bigint`` column that a fraction widens to
     ``decimal(38,18)`` is rewritten first (:func:`widen_to_decimal`);
  3. the typed rows set aside go to ``quarantine`` (``target_table`` names the typed table).

Idempotent by content like every write of the job: a batch replayed after a crash, or the
whole of ``events`` read again after this query's checkpoint was deleted, adds nothing. How
far the typed tables have come (the ``events`` version whose rows they all hold) is taken
from this query's progress and recorded in the next ``events`` commit
(:class:`outbox_lake.progress.LakeProgress`): a query that starts without a checkpoint reads
``events`` from the version after it, not from the beginning.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import date
from typing import TYPE_CHECKING, Any

from outbox.core.lake_contract import DECIMAL_TYPE
from outbox_lake.delta_writes import (
    IdRange,
    PendingAppend,
    append,
    append_absent,
    create_table,
    id_ranges,
    ids_of,
    ranges_of,
    rows_within,
    table_owner_and_columns,
)
from outbox_lake.metrics import LakeMetrics
from outbox_lake.names import typed_table_name
from outbox_lake.records import TYPING_RECURSION_LIMIT, recursion_limit
from outbox_lake.settings import LakeSettings
from outbox_lake.spark_typing import JvmTyping, jvm_typing
from outbox_lake.storage import open_table
from outbox_lake.tables import QUARANTINE_TABLE, TYPED_BASE
from outbox_lake.typed_rows import payload_columns, type_batch, typed_batch_schema, widens

if TYPE_CHECKING:
    from deltalake import DeltaTable
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.types import StructField, StructType

__all__ = ["TypedSink", "decide_columns", "typed_through", "widen_to_decimal", "widened"]

log = logging.getLogger("outbox.lake.typed")

_TYPED_BASE_NAMES = tuple(column.name for column in TYPED_BASE)
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
_FIELDS_SCHEMA = (
    "aggregate_type string, event_id string, event_date date, topic string, partition int, "
    "offset long, fields array<struct<name:string,kind:string>>"
)
_ASIDE = ("event_id", "_reason", "_topic", "_partition", "_offset", "_key", "_value", "_table")
"""What a typed row set aside keeps: the record it came from and why."""
_EVENT_COLUMNS = (
    "event_id",
    "aggregate_type",
    "aggregate_id",
    "event_type",
    "payload",
    "position",
    "event_time",
    "event_date",
    "topic",
    "partition",
    "offset",
)


def decide_columns(existing: dict[str, str], met: Iterable[tuple[Any, str, str]]) -> dict[str, str]:
    """A typed table's payload columns for a batch: those it has, then each new field in the
    order of the record that first brought it (its kind decided by that record). A field that
    differs only in case from a column, or from a field met earlier, gets no column (its rows
    are set aside with the reason). A column met with a kind that widens it
    (:func:`~outbox_lake.typed_rows.widens`: a fraction that fits ``decimal(38,18)``
    exactly, for a ``long`` column) takes that kind."""
    columns = dict(existing)
    taken = {name.lower() for name in (*existing, *_TYPED_BASE_NAMES)}
    for _, name, kind in sorted(met, key=lambda item: item[0]):
        if name.lower() in taken:
            if widens(columns.get(name), kind):
                columns[name] = kind
            continue
        taken.add(name.lower())
        columns[name] = kind
    return columns


def widened(existing: dict[str, str], columns: dict[str, str]) -> list[str]:
    """The table's columns whose kind ``columns`` changes (widens), in the table's order."""
    return [name for name, kind in existing.items() if columns.get(name, kind) != kind]


_JVM_TYPINGS_KEPT = 256
"""How many tables' JVM typing expressions the typed query keeps between batches."""

CACHED_TYPES = 4
"""A batch of more aggregate types than this is kept in memory while each type is written
(each type's write reads the whole batch: 80 types read the table's files 80 times)."""

FIRST_RECORDS = 1000
"""How many of a batch's first records decide a new typed table's columns (the later
records' new fields are decided as for a table that exists: by the pending rows)."""

WIDEN_ATTEMPTS = 3
"""A rewrite that meets a concurrent commit (a compaction by ``outbox lake maintain``) is
tried again this many times in all, then the batch fails (the job stops; run again, it
redoes the batch)."""


def widen_to_decimal(spark: SparkSession, uri: str, names: list[str]) -> None:
    """The typed table at ``uri`` rewritten with its ``bigint`` columns ``names`` as
    ``decimal(38,18)``: one Delta commit (an overwrite with the new schema) that replaces
    every file by one holding the same rows, each value kept (``10`` is
    ``10.000000000000000000``; every bigint fits, 2^63 being below 10^20).

    Not Delta's type widening, though Delta 4.4 does change ``long`` to ``decimal(38,18)``
    in place: it sets the reader table feature ``typeWidening``, which ``deltalake`` (1.6:
    ``outbox lake query``, DuckDB through Arrow, ``outbox reconcile``) refuses to read. The
    rewrite keeps the table at protocol 1/2 without a feature, its metadata name (the
    aggregate type), properties and partitions: every reader reads it. Readers see the
    table before or after the commit, never between; the old files stay until a vacuum
    past its retention. The typed query is the table's one writer (its rows are written
    only by this query, one batch at a time): the rewrite holds every row of the table."""
    from pyspark.sql import functions as f

    wanted = set(names)
    for attempt in range(1, WIDEN_ATTEMPTS + 1):
        table = spark.read.format("delta").load(uri)
        # Quoted: a payload field may be named "fee.net" (a backtick it may not hold).
        columns = [
            f.col(f"`{column}`").cast(DECIMAL_TYPE).alias(column)
            if column in wanted
            else f.col(f"`{column}`")
            for column in table.columns
        ]
        try:
            (
                table.select(*columns)
                .write.format("delta")
                .mode("overwrite")
                .option("overwriteSchema", "true")
                .partitionBy("event_date")
                .save(uri)
            )
            return
        except Exception as error:
            if attempt == WIDEN_ATTEMPTS or not _concurrent(error):
                raise
            log.warning("widening %s met a concurrent commit; again: %s", uri, error)


def _concurrent(error: Exception) -> bool:
    """Whether Delta refused a commit for a concurrent one (trying again may succeed)."""
    text = f"{type(error).__name__}: {error}"
    return "DELTA_CONCURRENT" in text or ("Concurrent" in text and "Exception" in text)


@dataclass
class TypeShape:
    """One aggregate type's part of a batch."""

    ranges: list[IdRange] = field(default_factory=list)


def typed_through(end_offset: dict[str, Any] | None) -> int | None:
    """The ``events`` version all of whose rows a typed query has processed, from its Delta
    source's end offset: ``reservoirVersion`` is the version it has read into, up to file
    ``index`` (Delta's ``END_INDEX``: all of it); an initial snapshot (the query started
    without ``startingVersion``) is done only when the offset has left it."""
    if not end_offset or end_offset.get("isStartingVersion", True):
        return None
    version = int(end_offset.get("reservoirVersion", 0))
    done = version if int(end_offset.get("index", -1)) == _END_INDEX else version - 1
    return done if done >= 0 else None


_END_INDEX = 2**63 - 101  # Long.MAX_VALUE - 100
"""Delta's ``DeltaSourceOffset.END_INDEX``: every file of the version was read."""


def _with_fields(batches: Iterable[Any]) -> Iterator[Any]:
    """``mapInArrow`` body: each event's payload fields (name, kind), in the payload's order."""
    import pyarrow as pa

    schema = pa.schema(
        [
            ("aggregate_type", pa.string()),
            ("event_id", pa.string()),
            ("event_date", pa.date32()),
            ("topic", pa.string()),
            ("partition", pa.int32()),
            ("offset", pa.int64()),
            ("fields", pa.list_(pa.struct([("name", pa.string()), ("kind", pa.string())]))),
        ]
    )
    for batch in batches:
        rows = batch.to_pylist()
        with recursion_limit(TYPING_RECURSION_LIMIT):
            for row in rows:
                columns = payload_columns(row.pop("payload")) or ()
                row["fields"] = [{"name": name, "kind": kind} for name, kind in columns]
        yield pa.RecordBatch.from_pylist(rows, schema=schema)


def batch_types(events: DataFrame) -> dict[str, TypeShape]:
    """Per aggregate type its days and event-id ranges (one small Spark aggregate, no
    Python: only this reaches the driver)."""
    from pyspark.sql import functions as f

    rows = (
        events.groupBy(
            "aggregate_type", "event_date", f.substring("event_id", 1, 8).alias("bucket")
        )
        .agg(f.min("event_id").alias("low"), f.max("event_id").alias("high"))
        .collect()
    )
    found: dict[str, TypeShape] = {}
    for row in rows:
        part = found.setdefault(row["aggregate_type"], TypeShape())
        part.ranges.append(IdRange(_date(row["event_date"]), row["low"], row["high"]))
    for part in found.values():
        part.ranges = id_ranges(part.ranges)
    return found


def new_fields(pending: DataFrame) -> list[tuple[tuple[str, int, int], str, str]]:
    """The payload fields the ``pending`` rows bring, each with its first appearance
    (topic, partition, offset) and kind (Python on the executors; few rows)."""
    from pyspark.sql import functions as f

    fields = pending.select(
        "aggregate_type", "event_id", "event_date", "topic", "partition", "offset", "payload"
    ).mapInArrow(_with_fields, _FIELDS_SCHEMA)
    rows = (
        fields.select(
            f.struct("topic", "partition", "offset").alias("at"),
            f.explode("fields").alias("field"),
        )
        .groupBy(f.lower(f.col("field.name")).alias("lname"), "field.kind")
        .agg(f.min("at").alias("first"), f.min_by("field.name", "at").alias("name"))
        .collect()
    )
    return [
        (
            (row["first"]["topic"], row["first"]["partition"], row["first"]["offset"]),
            row["name"],
            row["kind"],
        )
        for row in rows
    ]


def _date(value: Any) -> date:
    return value if isinstance(value, date) else date.fromisoformat(str(value))


@dataclass
class _Typed:
    frame: DataFrame
    counted: Any
    """Rows marked pending (a Spark accumulator)."""

    @property
    def pending(self) -> int:
        return int(self.counted.value)


class TypedSink:
    """``foreachBatch`` body of the typed query: new ``events`` rows into the typed tables."""

    def __init__(self, settings: LakeSettings, metrics: LakeMetrics, *, one_task: bool) -> None:
        self.settings = settings
        self.one_task = one_task
        """Whether a one-job write types and writes its rows in one task (one core): while
        the Kafka query runs beside this one, so that it always has a core."""
        self.metrics = metrics
        self.quarantine_uri = settings.table_uri(QUARANTINE_TABLE.name)
        self.timings: dict[str, float] = {}
        self._rejected: list[Any] = []
        """This batch's counts of typed rows set aside (accumulators)."""
        self._collisions = 0
        self._tried: set[str] = set()
        """The aggregate types whose one-job write ran in this batch (tried once)."""
        self._last_types: list[str] = []
        """The aggregate types of the batch before."""
        self._jvm_typing: dict[tuple[tuple[str, str], ...], JvmTyping | None] = {}
        """Per table's columns, how the JVM types its rows (parsed once)."""
        self._read_again: set[str] = set()
        """The aggregate types whose rows of the last batch had landed before (a batch
        read again after a crash or a deleted checkpoint): the two-job path, which leaves
        them out, takes them until a batch of theirs finds none landed."""

    def __call__(self, frame: DataFrame, batch_id: int) -> None:
        started = time.monotonic()
        self.timings = {}
        self._rejected = []
        self._collisions = 0
        self._tried = set()
        spark = frame.sparkSession
        events = frame.select(*_EVENT_COLUMNS)
        # Each type's write reads the batch: of many types, it is read from memory once
        # Spark has read it (not the events table's files once per type).
        cached: DataFrame | None = None
        if len(self._last_types) > CACHED_TYPES:
            events = cached = events.persist()
        try:
            types: set[str] | None = None
            in_one_job: list[str] = []
            # The types of the batch before are tried first, the batch's types observed on
            # the way: the common batch learns them without a job of its own.
            for guess in (t for t in self._last_types if t not in self._read_again):
                landed, seen = self._in_one_job(spark, events, guess, see_types=types is None)
                if landed:
                    in_one_job.append(guess)
                types = seen if types is None else types
                if types is not None:
                    break
            if types is None:
                with self._timed("types"):
                    types = {row[0] for row in events.select("aggregate_type").distinct().collect()}
            if not types:
                return
            if cached is None and len(types) > CACHED_TYPES:
                events = cached = events.persist()
            self._last_types = sorted(types)
            for aggregate_type in sorted(types - set(in_one_job)):
                if (
                    aggregate_type not in self._tried
                    and aggregate_type not in self._read_again
                    and self._in_one_job(spark, events, aggregate_type, see_types=False)[0]
                ):
                    in_one_job.append(aggregate_type)
            rest = sorted(types - set(in_one_job))
            self.metrics.typed_writes.labels("one_job").inc(len(in_one_job))
            self.metrics.typed_writes.labels("two_jobs").inc(len(rest))
            aside = self._in_two_jobs(spark, events, rest) if rest else 0
        finally:
            if cached is not None:
                cached.unpersist()
        self.metrics.quarantined.labels("typed").inc(aside)
        log.info(
            "typed batch %d: %d aggregate types (%d in one job), %d typed rows set aside, "
            "%.2f s (%s)",
            batch_id,
            len(types),
            len(in_one_job),
            aside,
            time.monotonic() - started,
            ", ".join(f"{stage} {seconds:.2f}" for stage, seconds in self.timings.items()),
        )

    def _in_one_job(
        self, spark: SparkSession, events: DataFrame, aggregate_type: str, *, see_types: bool
    ) -> tuple[bool, set[str] | None]:
        """One aggregate type's rows of the batch in one Spark job, as ``events`` lands its
        common batch: the typed rows' files are written (nothing visible yet) while the rows
        pending (a field the table lacks) and set aside are counted on the way; the driver
        reads the written ids back, looks them up in the table within their ranges, and
        commits the files. Whether it landed them (else its files, if any, were deleted
        uncommitted: the table is new or another type's, its schema is not the rows', a row
        was pending or set aside, or a copy has landed before, a batch read again; the
        two-job path, :meth:`_write_type`, decides), and with ``see_types`` the aggregate
        types of the whole batch, observed by the same job (None when no job ran)."""
        from pyspark.sql import Observation
        from pyspark.sql import functions as f

        name = typed_table_name(aggregate_type)
        uri = self.settings.table_uri(name)
        with self._timed("plan"):
            table = open_table(self.settings, uri)
            owner, existing = table_owner_and_columns(table, _TYPED_BASE_NAMES, _DELTA_KINDS)
            if table is None or owner != aggregate_type:
                return False, None
            pending = PendingAppend(spark, uri)
            if not pending.fits(_kept_schema(existing)):
                return False, None
            seeing = Observation() if see_types else None
            if seeing is not None:  # below the filter: it sees the whole batch (none moves under)
                events = events.observe(seeing, f.collect_set("aggregate_type").alias("types"))
            mine = events.where(f.col("aggregate_type") == aggregate_type)
            typed = self._typing(spark, mine, existing, name, pending=True)
            observation = Observation()
            rows = self._kept(
                typed.observe(
                    observation,
                    f.count_if(f.col("_pending")).alias("pending"),
                    f.count_if(f.col("_reason").isNotNull()).alias("aside"),
                )
            )
            if self.one_task:
                rows = rows.coalesce(1)
        committing = False
        seen: set[str] | None = None
        try:
            with self._timed("write"):
                self._tried.add(aggregate_type)
                pending.write(rows)
                counts = observation.get
                seen = None if seeing is None else set(seeing.get.get("types", ())) or None
            # no figure (the metrics not collected): as if a row were pending
            if counts.get("pending", 1) or counts.get("aside", 1) or not pending.paths:
                pending.discard()
                return False, seen
            with self._timed("landed"):
                written = pending.read(self.settings, ["event_id", "event_date"])
                ids = written.column("event_id").to_pylist()
                unique = set(ids)
                ranges = ranges_of(ids, written.column("event_date").to_pylist())
                landed = rows_within(self.settings, table, uri, ranges, ["event_id"], unique)
                if len(unique) < len(ids) or landed.num_rows:
                    pending.discard()
                    self._read_again.add(aggregate_type)
                    return False, seen
            with self._timed("commit"):
                committing = True
                pending.commit()
        except BaseException:
            if not committing:  # once the commit is tried, its files may be the table's
                pending.discard()
            raise
        return True, seen

    def _in_two_jobs(self, spark: SparkSession, events: DataFrame, types: list[str]) -> int:
        """The aggregate types ``types`` of the batch, each classified row by row: their
        shape first (one job), the copies landed before left out, rows with new fields
        typed again once the columns are decided, the rows set aside to quarantine; how
        many were set aside."""
        from pyspark.sql import functions as f

        events = events.where(f.col("aggregate_type").isin(types)).persist()
        set_aside: list[DataFrame] = []
        try:
            with self._timed("shape"):
                shapes = batch_types(events)
            typed_frames = []
            try:
                for aggregate_type, part in sorted(shapes.items()):
                    with self._timed("typed"):
                        frames = self._write_type(spark, events, aggregate_type, part)
                    typed_frames.extend(frames)
                    set_aside.extend(f.where("_reason IS NOT NULL").select(*_ASIDE) for f in frames)
                aside = 0
                if self._collisions or any(counted.value for counted in self._rejected):
                    with self._timed("quarantine"):
                        aside = self._quarantine(spark, set_aside)
            finally:
                for typed in typed_frames:
                    typed.unpersist()
        finally:
            events.unpersist()
        return aside

    @contextlib.contextmanager
    def _timed(self, stage: str) -> Iterator[None]:
        started = time.monotonic()
        try:
            yield
        finally:
            took = time.monotonic() - started
            self.timings[stage] = self.timings.get(stage, 0.0) + took
            self.metrics.stage_seconds.labels(f"typed_{stage}").observe(took)

    def _write_type(
        self, spark: SparkSession, events: DataFrame, aggregate_type: str, part: TypeShape
    ) -> list[DataFrame]:
        """Type one aggregate type's events on the executors and append the typed rows the
        table lacks; the typed frames (persisted; their ``_reason`` rows go to quarantine).

        One pass in the common case: every row is typed against the table's columns (in the
        JVM where it can be: :mod:`outbox_lake.spark_typing`); a row whose payload brings a
        field the table lacks is marked pending, and only if there are such rows are the new
        columns decided (the first record to bring a field decides its kind) and those rows
        typed again, in a second commit. A new table is created first, with the columns of
        the batch's first :data:`FIRST_RECORDS` records."""
        from pyspark.sql import functions as f

        name = typed_table_name(aggregate_type)
        uri = self.settings.table_uri(name)
        table = open_table(self.settings, uri)
        owner, existing = table_owner_and_columns(table, _TYPED_BASE_NAMES, _DELTA_KINDS)
        mine = events.where(f.col("aggregate_type") == aggregate_type)
        if owner is not None and owner != aggregate_type:
            reason = (
                f"the typed table {name} holds aggregate type {owner!r}, not "
                f"{aggregate_type!r}: the event is in events; report this name collision"
            )
            self._collisions += 1
            return [
                mine.select(
                    "event_id",
                    f.lit(reason).alias("_reason"),
                    f.col("topic").alias("_topic"),
                    f.col("partition").alias("_partition"),
                    f.col("offset").alias("_offset"),
                    f.encode("aggregate_id", "UTF-8").alias("_key"),
                    f.encode("payload", "UTF-8").alias("_value"),
                    f.lit(name).alias("_table"),
                ).persist()
            ]
        if owner is None:
            # A new table's columns, from the batch's first records (each field's kind is
            # decided by the first record that brings it: one in these, or one marked pending
            # below); the Python listing of fields stays bounded whatever the batch's size.
            first_records = mine.orderBy("topic", "partition", "offset").limit(FIRST_RECORDS)
            existing = decide_columns({}, new_fields(first_records))
            create_table(
                self.settings,
                uri,
                _typed_arrow_schema(typed_batch_schema(existing)),
                by_day=True,
                owner=aggregate_type,
            )
        # a table made just now holds nothing: no lookup
        landed = None if table is None else self._landed(table, uri, part, mine)
        if landed is None:
            self._read_again.discard(aggregate_type)
        else:
            mine = mine.join(f.broadcast(spark.createDataFrame(landed)), "event_id", "left_anti")
        first = self._typed(spark, mine, existing, name, pending=True)
        typed_frames = [first]
        append(self._kept(first.frame), uri, {"mergeSchema": "true"})
        if not first.pending:  # counted on the executors while typing (the common case)
            return [first.frame]
        pending = first.frame.where("_pending").select("event_id").join(mine, "event_id")
        columns = decide_columns(existing, new_fields(pending))
        widening = widened(existing, columns)
        if widening:
            log.info(
                "typed table %s: %s widened from bigint to %s (the table rewritten)",
                name,
                ", ".join(widening),
                DECIMAL_TYPE,
            )
            widen_to_decimal(spark, uri, widening)
        second = self._typed(spark, pending, columns, name, pending=False)
        typed_frames.append(second)
        append(self._kept(second.frame), uri, {"mergeSchema": "true"})
        return [typed.frame for typed in typed_frames]

    def _landed(self, table: DeltaTable, uri: str, part: TypeShape, mine: DataFrame) -> Any:
        """The ids of the batch's rows ``mine`` the typed table holds (None: none; read on
        the driver: the batch's ids first, then those of them in the table's files that
        may hold one, never every id a long backlog left in the batch's ranges)."""
        landed = rows_within(self.settings, table, uri, part.ranges, ["event_id"], ids_of(mine))
        return landed if landed.num_rows else None

    def _typed(
        self,
        spark: SparkSession,
        rows: DataFrame,
        columns: dict[str, str],
        name: str,
        *,
        pending: bool,
    ) -> _Typed:
        """``rows`` typed against ``columns`` on the executors (persisted), with the count of
        pending rows (an accumulator, known once the frame has been computed)."""
        counted = spark.sparkContext.accumulator(0)
        rejected = spark.sparkContext.accumulator(0)
        frame = self._typing(
            spark, rows, columns, name, pending=pending, counted=(counted, rejected)
        )
        self._rejected.append(rejected)
        return _Typed(frame.persist(), counted)

    def _typing(
        self,
        spark: SparkSession,
        rows: DataFrame,
        columns: dict[str, str],
        name: str,
        *,
        pending: bool,
        counted: tuple[Any, Any] | None = None,
    ) -> DataFrame:
        """``rows`` typed against ``columns``: in the JVM where it decides them
        (:mod:`outbox_lake.spark_typing`), by the Python rules otherwise (``counted``: the
        accumulators of rows pending and set aside there)."""
        from pyspark.sql import functions as f
        from pyspark.sql.pandas.types import from_arrow_schema

        schema = typed_batch_schema(columns)

        def typing(batches: Iterable[Any]) -> Iterator[Any]:
            for batch in batches:
                with recursion_limit(TYPING_RECURSION_LIMIT):
                    typed = type_batch(batch.to_pylist(), columns, name, pending=pending)
                if counted is not None:
                    counted[0].add(typed.column("_pending").true_count if pending else 0)
                    counted[1].add(typed.num_rows - typed.column("_reason").null_count)
                yield typed

        spark_schema = from_arrow_schema(schema)
        key = tuple(columns.items())
        if key not in self._jvm_typing:  # parsed once per table's columns
            if len(self._jvm_typing) >= _JVM_TYPINGS_KEPT:
                self._jvm_typing.clear()
            self._jvm_typing[key] = jvm_typing(columns)
        jvm = self._jvm_typing[key]
        python_rows = rows if jvm is None else rows.where(~jvm.decided)
        frame = (
            python_rows.withColumn("raw_key", f.encode("aggregate_id", "UTF-8"))
            .withColumn("raw_value", f.encode("payload", "UTF-8"))
            .mapInArrow(typing, spark_schema)
        )
        if jvm is not None:
            frame = self._typed_in_jvm(rows.where(jvm.decided), jvm, spark_schema).unionByName(
                frame
            )
        return frame.withColumn("_table", f.lit(name))

    @staticmethod
    def _typed_in_jvm(rows: DataFrame, jvm: JvmTyping, schema: StructType) -> DataFrame:
        """The rows the JVM types (:mod:`outbox_lake.spark_typing`), in ``schema``: the
        typed columns, and nothing set aside or pending."""
        from pyspark.sql import functions as f

        def column(field: StructField) -> Column:
            if field.name in jvm.values:
                return jvm.values[field.name]
            if field.name in _TYPED_BASE_NAMES:
                return f.col(field.name).cast(field.dataType).alias(field.name)
            return f.lit(None).cast(field.dataType).alias(field.name)  # _reason, _pending...

        return rows.select(*(column(field) for field in schema.fields))

    @staticmethod
    def _kept(frame: DataFrame) -> DataFrame:
        """The typed rows of ``frame`` (neither set aside nor pending), in the table's
        columns."""
        return frame.where("_reason IS NULL AND _pending IS NOT TRUE").drop(
            "_reason", "_topic", "_partition", "_offset", "_key", "_value", "_table", "_pending"
        )

    def _quarantine(self, spark: SparkSession, set_aside: list[DataFrame]) -> int:
        """The typed rows set aside, into ``quarantine`` (those it lacks); how many."""
        from pyspark.sql import functions as f

        if not set_aside:
            return 0
        rows = set_aside[0]
        for frame in set_aside[1:]:
            rows = rows.unionByName(frame)
        rows = rows.select(
            f.concat_ws(":", f.col("_table"), f.col("event_id")).alias("quarantine_id"),
            f.col("_table").alias("target_table"),
            f.col("_topic").alias("topic"),
            f.col("_partition").alias("partition"),
            f.col("_offset").alias("offset"),
            f.col("_key").alias("key"),
            f.col("_value").alias("value"),
            "event_id",
            f.col("_reason").alias("reason"),
        )
        return append_absent(
            self.settings, self.quarantine_uri, rows, "quarantine_id", QUARANTINE_TABLE.names
        )


def _kept_schema(columns: dict[str, str]) -> StructType:
    """The typed rows' schema as a table with payload ``columns`` keeps them."""
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(_typed_arrow_schema(typed_batch_schema(columns)))


def _typed_arrow_schema(schema: Any) -> Any:
    import pyarrow as pa

    return pa.schema([column for column in schema if not column.name.startswith("_")])
