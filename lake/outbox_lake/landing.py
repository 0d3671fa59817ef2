"""The freshness path: one micro-batch of Spark's Kafka source into ``events``, in one commit.

For each micro-batch (``foreachBatch(frame, batch_id)``), the JVM has read the contract
already (:func:`outbox_lake.spark_contract.read_contract`, part of the query's plan:
``frame`` comes with its columns): every record the delivery paths write is decided there
with Spark's built-in functions; the few it cannot decide go, alone, to the Python contract,
which makes each an event or a quarantine row with its reason. Nothing a record holds can
fail the batch. Then one of two paths lands it:

- **one job** (the common batch, as Spark's own Delta sink lands one): the decided events'
  files are written (Delta's transaction API: nothing is visible yet) while the batch's
  shape is observed on the way (per partition its offsets and last record; the records not
  decided); the driver reads the written ids back (their days, ranges and repeats), the
  caller's check (:class:`outbox_lake.guard.LogGuard`) may refuse the batch, the ids are
  looked up in ``events`` within their ranges, and the files are committed with the
  progress. When a record was not decided, an id is twice in the batch or a copy has
  landed before, the files are deleted uncommitted and the batch takes the other path;
- **two jobs** (any batch): the driver learns the batch's shape (:class:`BatchShape`, one
  job over the cached records) and the check may refuse it before anything is written; then
  **dedup by event id, no MERGE**: of the copies of an event in the batch the one with the
  lowest outbox ``position`` (drawn by the database when the row was written: a copy
  written later with the same id, by whichever service, comes after), then the lowest
  (topic, partition, offset), is the first; one left join against ``events``, read only
  within the batch's id ranges, finds copies already landed (always the first). A copy
  whose content (aggregate, type, payload, headers, trace, position) equals the first is a
  duplicate, dropped and counted; one whose content differs is a *conflicting copy*: never a
  duplicate, it goes to ``quarantine`` with the reason, naming where the first copy is.
  ``quarantine`` gets its rows first (records no event can be made of, conflicting
  copies), so the commit that names a batch's offsets comes last; then ``events`` gets the
  new events in **one append**.

Either way the commit to ``events`` carries the lake's progress after the batch
(:mod:`outbox_lake.progress`); a batch with no new event commits all the same (the progress
moves). Re-reading any range, for any reason, adds nothing and skips nothing: a replayed
batch finds its events already in the table. Typed tables are not on this path
(:mod:`outbox_lake.typed`).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from outbox.core.errors import OutboxError
from outbox.tracing import MAX_LINKS, landing, link, recording
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
)
from outbox_lake.metrics import LakeMetrics
from outbox_lake.offsets import Partition
from outbox_lake.progress import LakeProgress, advanced
from outbox_lake.records import FALLBACK_SCHEMA, parse_batch
from outbox_lake.settings import LakeSettings
from outbox_lake.spark_contract import EVENT_FIELDS, RAW_FIELDS
from outbox_lake.storage import open_table
from outbox_lake.tables import EVENTS_TABLE, QUARANTINE_TABLE

if TYPE_CHECKING:
    from deltalake import DeltaTable
    from opentelemetry.trace import Span
    from pyspark.sql import Column, DataFrame, SparkSession

__all__ = ["BatchShape", "EventsSink", "content_digest", "quarantine_id"]

log = logging.getLogger("outbox.lake.landing")

_CONTENT = (
    "aggregate_type",
    "aggregate_id",
    "event_type",
    "payload",
    "headers",
    "traceparent",
    "position",
)
"""What two copies of one event must share to be the same event (the record's content;
where it was read is not content)."""


@dataclass
class BatchShape:
    """What the driver knows of a batch: no row, only its shape."""

    ends: dict[Partition, tuple[int, str | None]] = field(default_factory=dict)
    """{partition: (offset after its last record, that record's fingerprint)}"""
    starts: dict[Partition, int] = field(default_factory=dict)
    """{partition: its first record's offset in the batch}"""
    records: int = 0
    undecided: int = 0
    events: int = 0
    """Records the JVM decided (events, before dedup)."""
    repeated: int = 0
    """Decided records whose event id another decided record of the batch also has."""
    ranges: list[IdRange] = field(default_factory=list)
    newest_event_time: float | None = None

    @property
    def topics(self) -> list[str]:
        return sorted({where.topic for where in self.ends})


def content_digest() -> Column:
    """SHA-256 of an event's content columns, each length-prefixed (no two contents alike)."""
    from pyspark.sql import functions as f

    parts = []
    for name in _CONTENT:
        text = f.col(name).cast("string")
        parts.append(f.coalesce(f.length(text).cast("string"), f.lit("-")))
        parts.append(f.coalesce(text, f.lit("")))
    return f.sha2(f.concat_ws(":", *parts), 256)


def quarantine_id() -> Column:
    """:func:`outbox_lake.records.record_quarantine_id` in Spark's functions (the same
    text: the record's coordinates and a digest of its key and value bytes)."""
    from pyspark.sql import functions as f

    def framed(column: str) -> Column:
        length = f.encode(
            f.concat(f.lit("+"), f.length(column).cast("string"), f.lit(":")), "UTF-8"
        )
        return f.when(f.col(column).isNull(), f.lit(b"-")).otherwise(f.concat(length, column))

    digest = f.sha2(f.concat(framed("key"), framed("value")), 256)
    return f.concat_ws(
        ":",
        "topic",
        f.col("partition").cast("string"),
        f.col("offset").cast("string"),
        f.substring(digest, 1, 32),
    )


class EventsSink:
    """``foreachBatch`` body of the Kafka query: each micro-batch into ``events`` (and
    ``quarantine``), exactly once.

    ``check``: called with the batch's shape before anything is written; it returns the
    topics' ids now, or raises to refuse the batch. ``typed_through``: how far the typed
    tables have come, recorded with the progress. ``started_over``: topics read again from
    their start, whose earlier progress the first commit drops.
    """

    def __init__(
        self,
        settings: LakeSettings,
        progress: LakeProgress,
        metrics: LakeMetrics,
        check: Callable[[BatchShape, LakeProgress], Mapping[str, str | None]],
        typed_through: Callable[[], int | None] = lambda: None,
        started_over: frozenset[str] = frozenset(),
    ) -> None:
        self.settings = settings
        self.progress = progress
        self.metrics = metrics
        self.check = check
        self.typed_through = typed_through
        self.started_over = started_over
        self.events_uri = settings.table_uri(EVENTS_TABLE.name)
        self.quarantine_uri = settings.table_uri(QUARANTINE_TABLE.name)
        self._events: DeltaTable | None = None
        self.failure: OutboxError | None = None
        """Our own error that stopped a batch (Spark hands it back as Java text)."""

    def create_tables(self) -> None:
        """``events`` and ``quarantine``, empty, before the first batch (every documented
        query runs on a new lake)."""
        for table, uri in (
            (EVENTS_TABLE, self.events_uri),
            (QUARANTINE_TABLE, self.quarantine_uri),
        ):
            create_table(self.settings, uri, table.arrow_schema(), by_day=table.by_day, owner=None)

    def __call__(self, frame: DataFrame, batch_id: int) -> None:
        try:
            with landing() as span:
                self._batch(frame, batch_id, span)
        except OutboxError as error:  # ours, typed: the loop raises it as it is
            self.failure = error
            raise

    def _batch(self, frame: DataFrame, batch_id: int, span: Span | None) -> None:
        started = time.monotonic()
        self.timings: dict[str, float] = {}
        traced = span is not None and recording(span)
        landed = self._in_one_job(frame, traced)
        one_job = landed is not None
        if landed is None:
            landed = self._in_two_jobs(frame, traced)
        if landed is None:
            return  # no record (transaction markers only)
        shape, counts, traceparents = landed
        if span is not None and traced:
            try:  # after the commit: tracing never fails a batch
                _describe(span, batch_id, shape, counts, traceparents)
            except Exception as error:  # the batch has landed already
                log.warning("batch %d: its span not described: %s", batch_id, error)
        took = time.monotonic() - started
        self.metrics.batch_done(took, shape.newest_event_time, one_job=one_job)
        self.metrics.events.inc(counts.get("new", 0))
        self.metrics.duplicates.inc(counts.get("duplicate", 0))
        # what quarantine did not hold yet (a batch read again sets nothing aside twice)
        self.metrics.conflicting.inc(counts.get("new_conflicting", 0))
        self.metrics.quarantined.labels("record").inc(counts.get("new_record", 0))
        log.info(
            "batch %d: %d records, %d events landed, %d duplicates, %d conflicting, "
            "%d set aside, %.2f s in %s (%s)",
            batch_id,
            shape.records,
            counts.get("new", 0),
            counts.get("duplicate", 0),
            counts.get("conflicting", 0),
            counts.get("record", 0),
            took,
            "one job" if one_job else "two jobs",
            ", ".join(f"{stage} {seconds:.2f}" for stage, seconds in self.timings.items()),
        )

    def _in_one_job(self, frame: DataFrame, traced: bool) -> _Landed | None:
        """The common batch (every record decided by the JVM, each event id once, none
        landed before) in one Spark job, as Spark's own Delta sink lands a batch: the
        events' files are written with the batch's shape observed on the way, then the
        driver checks (the caller's check, the ids against ``events``) and commits them
        with the progress. None, with nothing written: the batch needs the two-job path
        (:meth:`_in_two_jobs`) that classifies each copy."""
        from pyspark.sql import Observation
        from pyspark.sql import functions as f

        with self._timed("plan"):
            tasks = _task_count(frame)
            if tasks is None or not 0 < tasks <= MAX_ONE_JOB_TASKS:
                return None
            observation = Observation()
            observed = frame.withColumn("task", f.spark_partition_id()).observe(
                observation, *_task_metrics(tasks)
            )
            rows = (
                decided_events(observed)
                .withColumn("ingest_time", f.current_timestamp())
                .select(*EVENTS_TABLE.names)
            )
            pending = PendingAppend(frame.sparkSession, self.events_uri)
            if not pending.fits(rows.schema):  # Delta's own writer says what differs
                return None
        committing = False
        try:
            with self._timed("write"):
                pending.write(rows)
            with self._timed("shape"):
                shape = _observed_shape(observation.get, tasks)
                if shape is None or shape.undecided or not shape.ends:
                    pending.discard()
                    return None
                columns = ["event_id", "event_date", "event_time"]
                if traced:  # the traces too: the files are read once
                    columns.append("traceparent")
                written = pending.read(self.settings, columns)
                ids = _ids_shape(shape, written)
                if shape.repeated:
                    pending.discard()
                    return None
            with self._timed("check"):
                topic_ids = self.check(shape, self.known())
            with self._timed("landed"):
                if self._landed(shape.ranges, ["event_id"], ids).num_rows:
                    pending.discard()
                    return None
            after = self._after(shape, topic_ids)
            with self._timed("events"):
                committing = True
                pending.commit(after.to_metadata())
        except BaseException:
            if not committing:  # once the commit is tried, its files may be the table's
                pending.discard()
            raise
        self.progress = after
        self.started_over = frozenset()
        traceparents: list[str] = []
        if traced and written is not None:  # a sample of the events' traces
            traceparents = [t for t in written.column("traceparent").to_pylist() if t]
        return shape, {"new": shape.events}, traceparents[:MAX_LINKS]

    def _in_two_jobs(self, frame: DataFrame, traced: bool) -> _Landed | None:
        """Any batch: its shape first (one job over the cached records), then each copy
        classified and the new events appended (a second job)."""
        with self._timed("plan"):
            # ``frame`` has the contract's columns (the query reads it: read_contract); only
            # what the append needs is cached; the raw bytes of records the JVM did not
            # decide are read again from Kafka (rare)
            read = frame.select(*_CACHED).persist()
        try:
            with self._timed("shape"):
                shape = batch_shape(read)
            if not shape.ends:
                return None
            with self._timed("check"):
                topic_ids = self.check(shape, self.known())
            counts = self._write(frame.sparkSession, read, frame, shape, topic_ids)
            traceparents = _sample_traceparents(read) if traced else []
        finally:
            with self._timed("unpersist"):
                read.unpersist()
        return shape, counts, traceparents

    @contextlib.contextmanager
    def _timed(self, stage: str) -> Iterator[None]:
        started = time.monotonic()
        try:
            yield
        finally:
            took = time.monotonic() - started
            self.timings[stage] = self.timings.get(stage, 0.0) + took
            self.metrics.stage_seconds.labels(stage).observe(took)

    def _write(
        self,
        spark: SparkSession,
        read: DataFrame,
        contract: DataFrame,
        shape: BatchShape,
        topic_ids: Mapping[str, str | None],
    ) -> dict[str, int]:
        """Quarantine first (when anything is set aside), then the batch's new events and
        the progress in one commit to ``events``; the counts of each class of record."""
        from pyspark.sql import functions as f

        events = decided_events(read)
        aside = None
        slow = None
        ranges = list(shape.ranges)
        if shape.undecided:
            slow = undecided_rows(contract).persist()
            ranges = id_ranges([*ranges, *_slow_ranges(slow)])
            events = events.unionByName(slow.where("kind = 'event'").select(*_EVENT_SELECT))
            aside = slow.where("kind = 'quarantine'").select(
                "quarantine_id",
                f.lit(EVENTS_TABLE.name).alias("target_table"),
                "topic",
                "partition",
                "offset",
                "key",
                "value",
                "event_id",
                "reason",
            )
        classified: DataFrame | None = None
        try:
            with self._timed("landed"):
                # the batch's ids on the driver (a batch's worth), then the landed rows of
                # those ids alone: never every landed row of a long backlog
                landed = self._landed(ranges, list(_LANDED), ids_of(events))
                met = landed.num_rows > 0
            if slow is None and not shape.repeated and not met:
                # the common case: every event of the batch is new
                counts = {"new": shape.events}
                new = events
            else:
                with self._timed("dedup"):
                    classified = classify(spark, events, landed).persist()
                    counts = {
                        row["class"]: int(row["count"])
                        for row in classified.groupBy("class").count().collect()
                    }
                new = classified.where("class = 'new'")
                if slow is not None:
                    counts["record"] = int(slow.where("kind = 'quarantine'").count())
                with self._timed("quarantine"):
                    if aside is not None and counts.get("record", 0):
                        counts["new_record"] = self._quarantine(aside)
                    if counts.get("conflicting", 0):
                        rows = conflicting_copies(classified)
                        counts["new_conflicting"] = self._quarantine(rows)
            after = self._after(shape, topic_ids)
            with self._timed("events"):
                append(
                    new.withColumn("ingest_time", f.current_timestamp()).select(
                        *EVENTS_TABLE.names
                    ),
                    self.events_uri,
                    {"userMetadata": after.to_metadata()},
                )
            self.progress = after
            self.started_over = frozenset()
        finally:
            if classified is not None:
                classified.unpersist()
            if slow is not None:
                slow.unpersist()
        return counts

    def _after(self, shape: BatchShape, topic_ids: Mapping[str, str | None]) -> LakeProgress:
        """The lake's progress once the batch has landed."""
        return LakeProgress(
            advanced(
                self.progress.partitions, shape.ends, topic_ids, started_over=self.started_over
            ),
            self._typed_through(),
        )

    def _typed_through(self) -> int | None:
        """How far the typed tables have come: as the typed query last said, never less
        than the progress already recorded."""
        said, known = self.typed_through(), self.progress.typed_through
        return known if said is None else max(said, known or said)

    def record_typed_progress(self, spark: SparkSession) -> None:
        """A commit of ``events`` with no row, when the typed tables have come further than
        its last commit says (after a run that ends: the next batch would say it)."""
        from pyspark.sql import functions as f

        typed = self._typed_through()
        if typed is None or typed == self.progress.typed_through:
            return
        after = LakeProgress(self.progress.partitions, typed)
        empty = spark.read.format("delta").load(self.events_uri).limit(0)
        append(
            empty.select(*(f.col(n) for n in EVENTS_TABLE.names)),
            self.events_uri,
            {"userMetadata": after.to_metadata()},
        )
        self.progress = after

    def known(self) -> LakeProgress:
        """The progress the batch is checked against: without the topics started over."""
        if not self.started_over:
            return self.progress
        partitions = self.progress.partitions
        return LakeProgress(
            {w: p for w, p in partitions.items() if w.topic not in self.started_over},
            self.progress.typed_through,
        )

    def _landed(
        self, ranges: list[IdRange], columns: list[str], ids: Collection[str] | None = None
    ) -> Any:
        """``events``' rows in ``ranges`` (of ``ids`` only, when given), read on the driver
        (``deltalake``, the table's latest version: this job's last commit included)."""
        if self._events is None:
            self._events = open_table(self.settings, self.events_uri)
        else:
            self._events.update_incremental()
        assert self._events is not None  # created before the first batch
        return rows_within(self.settings, self._events, self.events_uri, ranges, columns, ids)

    def _quarantine(self, rows: DataFrame) -> int:
        """The rows set aside, into ``quarantine`` (those it lacks); how many were new."""
        return append_absent(
            self.settings, self.quarantine_uri, rows, "quarantine_id", QUARANTINE_TABLE.names
        )


def _describe(
    span: Span,
    batch_id: int,
    shape: BatchShape,
    counts: Mapping[str, int],
    traceparents: list[str],
) -> None:
    """The batch's span (recorded by an SDK): its counts, and links to a sample of its
    events' traces."""
    span.set_attribute("outbox.lake.batch_id", batch_id)
    span.set_attribute("messaging.batch.message_count", shape.records)
    span.set_attribute("outbox.lake.events_landed", counts.get("new", 0))
    span.set_attribute("outbox.lake.duplicates", counts.get("duplicate", 0))
    span.set_attribute("outbox.lake.set_aside", counts.get("record", 0))
    span.set_attribute("outbox.lake.conflicting", counts.get("conflicting", 0))
    link(span, traceparents)


def _sample_traceparents(read: DataFrame) -> list[str]:
    """Some of a cached batch's events' traces (one small read, only when traced)."""
    sample = (
        read.where("decided AND traceparent IS NOT NULL AND traceparent <> ''")
        .select("traceparent")
        .limit(MAX_LINKS)
        .collect()
    )
    return [row["traceparent"] for row in sample]


MAX_ONE_JOB_TASKS = 32
"""A batch of more Kafka partitions than this takes the two-job path (the one-job path
observes a few figures per partition: their count grows the plan)."""

_Landed = tuple[BatchShape, dict[str, int], list[str]]
"""A landed batch: its shape, the count of each class of record, a sample of its traces."""


def _task_count(frame: DataFrame) -> int | None:
    """How many tasks read the batch (``foreachBatch`` hands it over as one RDD: Spark's
    Kafka source makes one task per topic partition with records to read); None when the
    plan is not that."""
    try:
        leaves = frame._jdf.queryExecution().logical().collectLeaves()
        if leaves.size() != 1:
            return None
        return int(leaves.apply(0).rdd().getNumPartitions())
    except Exception:  # another plan than the one this reads: the two-job path
        return None


def _task_metrics(tasks: int) -> list[Column]:
    """Per task of the read (one topic partition each; checked, not assumed): its topic and
    partition (lowest and highest: equal when the task read one), first and last offset,
    the last record's fingerprint and the record count; and the records not decided."""
    from pyspark.sql import functions as f

    metrics = [f.count_if(~f.col("decided")).alias("undecided")]
    for task in range(tasks):
        here = f.col("task") == task

        def of(column: str, here: Column = here) -> Column:
            return f.when(here, f.col(column))

        metrics += [
            f.min(of("topic")).alias(f"topic_low_{task}"),
            f.max(of("topic")).alias(f"topic_high_{task}"),
            f.min(of("partition")).alias(f"partition_low_{task}"),
            f.max(of("partition")).alias(f"partition_high_{task}"),
            f.min(of("offset")).alias(f"first_{task}"),
            f.max(of("offset")).alias(f"last_{task}"),
            f.max_by(f.col("fingerprint"), of("offset")).alias(f"fingerprint_{task}"),
            f.count_if(here).alias(f"records_{task}"),
        ]
    return metrics


def _observed_shape(metrics: Mapping[str, Any], tasks: int) -> BatchShape | None:
    """The batch's partitions from the observed figures (:func:`_task_metrics`); None when
    a task read more than one partition, or two tasks one (the two-job path decides)."""
    shape = BatchShape(undecided=int(metrics["undecided"] or 0))
    for task in range(tasks):
        records = int(metrics[f"records_{task}"] or 0)
        if not records:
            continue
        topic, partition = metrics[f"topic_low_{task}"], metrics[f"partition_low_{task}"]
        alone = (topic, partition) == (
            metrics[f"topic_high_{task}"],
            metrics[f"partition_high_{task}"],
        )
        if not alone:
            return None
        where = Partition(str(topic), int(partition))
        if where in shape.ends:
            return None
        shape.ends[where] = (int(metrics[f"last_{task}"]) + 1, metrics[f"fingerprint_{task}"])
        shape.starts[where] = int(metrics[f"first_{task}"])
        shape.records += records
    return shape


def _ids_shape(shape: BatchShape, written: Any) -> set[str]:
    """Fill ``shape``'s event figures (count, repeated ids, id ranges by day and bucket,
    newest event time) from the written rows (an Arrow table of ``event_id``,
    ``event_date``, ``event_time``), as :func:`batch_shape` computes them; the ids."""
    import datetime as dt

    if written is None or written.num_rows == 0:
        return set()
    ids = written.column("event_id").to_pylist()
    days = written.column("event_date").to_pylist()
    shape.events = len(ids)
    unique = set(ids)
    shape.repeated = len(ids) - len(unique)
    shape.ranges = ranges_of(ids, days)
    newest = max(written.column("event_time").to_pylist())
    shape.newest_event_time = newest.replace(tzinfo=dt.UTC).timestamp()
    return unique


_CACHED = ("decided", *EVENT_FIELDS, "topic", "partition", "offset", "key", "fingerprint")
"""The read batch's columns kept in memory between its aggregate and its append."""

_EVENT_SELECT = (
    "event_id",
    "aggregate_type",
    "aggregate_id",
    "event_type",
    "payload",
    "headers",
    "traceparent",
    "position",
    "event_time",
    "event_date",
    "topic",
    "partition",
    "offset",
    "key",
)


def decided_events(read: DataFrame) -> DataFrame:
    """The events the JVM decided, in the columns of :data:`_EVENT_SELECT`."""
    from pyspark.sql import functions as f

    columns = [
        f.col("headers_text" if name == "headers" else name).alias(name) for name in _EVENT_SELECT
    ]
    return read.where("decided").select(*columns)


_LANDED = ("event_id", *_CONTENT, "topic", "partition", "offset")


def classify(spark: SparkSession, events: DataFrame, landed: Any) -> DataFrame:
    """``events`` with ``class``: ``new`` (the first copy, not in the table), ``duplicate``
    (the same content as the first copy, in the batch or the table) or ``conflicting``
    (another content), and ``first_at`` (where the first copy was read). ``landed``: the
    table's rows in the batch's id ranges (an Arrow table of :data:`_LANDED`)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as f

    by_id = Window.partitionBy("event_id").orderBy(
        f.col("position").asc_nulls_last(), "topic", "partition", "offset"
    )
    where_read = f.concat_ws(
        "",
        "topic",
        f.lit("["),
        f.col("partition").cast("string"),
        f.lit("]@"),
        f.col("offset").cast("string"),
    )
    ranked = (
        events.withColumn("digest", content_digest())
        .withColumn("n", f.row_number().over(by_id))
        .withColumn("first_digest", f.first("digest").over(by_id))
        .withColumn("first_at", f.first(where_read).over(by_id))
    )
    if landed.num_rows == 0:
        return ranked.withColumn(
            "class",
            f.when(f.col("n") == 1, "new")
            .when(f.col("digest") == f.col("first_digest"), "duplicate")
            .otherwise("conflicting"),
        )
    table = spark.createDataFrame(landed).select(
        "event_id",
        content_digest().alias("landed_digest"),
        where_read.alias("landed_at"),
    )
    joined = ranked.join(f.broadcast(table), "event_id", "left")
    first = f.coalesce(f.col("landed_digest"), f.col("first_digest"))
    return joined.withColumn(
        "class",
        f.when(f.col("landed_digest").isNull() & (f.col("n") == 1), "new")
        .when(f.col("digest") == first, "duplicate")
        .otherwise("conflicting"),
    ).withColumn("first_at", f.coalesce("landed_at", "first_at"))


def conflicting_copies(classified: DataFrame) -> DataFrame:
    """The conflicting copies of a classified batch as quarantine rows, with the reason."""
    from pyspark.sql import functions as f

    return (
        classified.where("class = 'conflicting'")
        .withColumn("value", f.encode("payload", "UTF-8"))
        .select(
            quarantine_id().alias("quarantine_id"),
            f.lit(EVENTS_TABLE.name).alias("target_table"),
            "topic",
            "partition",
            "offset",
            "key",
            "value",
            "event_id",
            f.concat(
                f.lit("conflicting copy: another copy of event "),
                "event_id",
                f.lit(" with different content is in the lake (first read at "),
                "first_at",
                f.lit(
                    "): this copy is set aside, not landed; a publisher may have reused or "
                    "forged the id"
                ),
            ).alias("reason"),
        )
    )


def undecided_rows(read: DataFrame) -> DataFrame:
    """The records the JVM did not decide, through the Python contract (on the executors)."""
    return (
        read.where("NOT decided")
        .select(*RAW_FIELDS)
        .mapInArrow(parse_batch, FALLBACK_SCHEMA)
        .withColumnRenamed("raw_key", "key")
        .withColumnRenamed("raw_value", "value")
    )


def _slow_ranges(slow: DataFrame) -> list[IdRange]:
    from pyspark.sql import functions as f

    rows = (
        slow.where("kind = 'event'")
        .groupBy("event_date", f.substring("event_id", 1, 8).alias("bucket"))
        .agg(f.min("event_id").alias("low"), f.max("event_id").alias("high"))
        .collect()
    )
    return [IdRange(row["event_date"], row["low"], row["high"]) for row in rows]


def batch_shape(read: DataFrame) -> BatchShape:
    """One small aggregate over the read batch, per partition and per day and id bucket
    (``grouping`` tells them apart); no row reaches the driver."""
    from pyspark.sql import functions as f

    per_partition = read.groupBy("topic", "partition").agg(
        f.lit("partition").alias("grouping"),
        f.max("offset").alias("last"),
        f.min("offset").alias("first"),
        f.max_by("fingerprint", "offset").alias("fingerprint"),
        f.count(f.lit(1)).alias("records"),
        f.count_if(~f.col("decided")).alias("undecided"),
    )
    per_bucket = (
        read.where("decided")
        .groupBy("event_date", f.substring("event_id", 1, 8).alias("bucket"))
        .agg(
            f.lit("ids").alias("grouping"),
            f.min("event_id").alias("low"),
            f.max("event_id").alias("high"),
            # milliseconds: a time beyond the year 9999 is no Python datetime
            f.unix_millis(f.max("event_time")).alias("newest"),
            f.count(f.lit(1)).alias("events"),
            # exact, and one aggregation level (count_distinct adds an Expand and a second
            # shuffle: 0.45 s of a 6,000-record batch)
            f.size(f.collect_set("event_id")).alias("ids"),
        )
    )
    shape = BatchShape()
    found = []
    for row in per_partition.unionByName(per_bucket, allowMissingColumns=True).collect():
        if row["grouping"] == "partition":
            where = Partition(row["topic"], int(row["partition"]))
            shape.ends[where] = (int(row["last"]) + 1, row["fingerprint"])
            shape.starts[where] = int(row["first"])
            shape.records += int(row["records"])
            shape.undecided += int(row["undecided"])
            continue
        found.append(IdRange(row["event_date"], row["low"], row["high"]))
        shape.events += int(row["events"])
        shape.repeated += int(row["events"]) - int(row["ids"])
        newest = row["newest"] / 1000
        shape.newest_event_time = max(shape.newest_event_time or newest, newest)
    shape.ranges = id_ranges(found)
    return shape
