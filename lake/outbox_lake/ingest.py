"""The ingest job: two streaming queries on one Spark session, run until the caller says stop.

- **The Kafka query** (the freshness path): Spark's own ``format("kafka")`` source,
  committed records only, topics by ``subscribePattern`` (new topics are picked up without a
  restart), ``maxOffsetsPerTrigger`` for admission control, into
  :class:`outbox_lake.landing.EventsSink` (``events``, ``quarantine``).
- **The typed query**: Delta's streaming source on ``events`` into
  :class:`outbox_lake.typed.TypedSink` (``aggregate_<type>``, ``quarantine``).
- **Checks**: :class:`outbox_lake.guard.LogGuard` answers at start and before every Kafka
  batch; this loop acts on its verdict (stop with a :class:`DataLossError`, or move the
  Kafka query's checkpoint aside and read replaced topics from their start).
- **Progress and lag** come from a ``StreamingQueryListener``: consumer lag per partition
  (Spark's source reports the latest offsets it saw beside where each batch ended) and how
  far the typed tables have come.
- **No checkpoint** (a new lake, a deleted checkpoint, one moved aside): the Kafka query
  starts where the lake's progress says (in ``events``' last commit), every other partition
  from its start; the typed query from the ``events`` version after the typed tables'.

:meth:`Ingest.run` takes its stop signal from the caller (``outbox lake ingest`` sets it on
SIGTERM or Ctrl-C, and serves the metrics): the batch under way lands, then both queries
stop.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from outbox.core.errors import DataLossError, OutboxError
from outbox.settings import KafkaSettings
from outbox_lake.guard import LogGuard, Refuse, StartOver
from outbox_lake.kafka_metadata import LAKE_CLIENT_ID, PATIENCE_SECONDS, KafkaMetadata
from outbox_lake.kafka_options import spark_options
from outbox_lake.landing import EventsSink
from outbox_lake.metrics import LakeMetrics
from outbox_lake.offsets import starting_offsets
from outbox_lake.progress import LakeProgress
from outbox_lake.session import FRESHNESS_POOL, TYPED_POOL
from outbox_lake.settings import LakeSettings
from outbox_lake.spark_contract import RAW_FIELDS, read_contract
from outbox_lake.storage import check_access, has_folder, move_aside, open_table
from outbox_lake.tables import EVENTS_TABLE
from outbox_lake.typed import TypedSink, typed_through
from outbox_lake.upgrade import earlier_progress, move_aside_earlier_checkpoint

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

__all__ = ["Ingest", "kafka_options"]

log = logging.getLogger("outbox.lake.ingest")

_STOP_PATIENCE_SECONDS = 120.0
TYPED_TRIGGER_SECONDS = 3.0
"""The typed query's least interval (off the freshness path: its tables trail ``events``)."""
_WATCH_SECONDS = 5.0
"""How often the running job checks the broker's topics against the lake's progress."""


def kafka_options(settings: LakeSettings, kafka: KafkaSettings) -> dict[str, str]:
    """The options of every read of Kafka by Spark (the stream, and a range read again): the
    cluster and its security as ``OUTBOX_KAFKA_*`` say (secrets inline, never logged),
    committed records only. ``failOnDataLoss`` is off: the job's guard decides."""
    return {
        **spark_options(kafka),
        "kafka.isolation.level": "read_committed",
        "kafka.client.id": LAKE_CLIENT_ID,
        # The consumers' group ids start so: a prefixed group ACL covers them.
        "groupIdPrefix": LAKE_CLIENT_ID,
        "includeHeaders": "true",
        "failOnDataLoss": "false",
        # A broker that does not answer for a while is waited for, not data loss.
        "kafka.request.timeout.ms": "30000",
        "kafka.default.api.timeout.ms": str(int(PATIENCE_SECONDS * 1000)),
    }


class _Listener:
    """Spark's streaming progress, as metrics and as how far the typed tables have come."""

    def __init__(self, metrics: LakeMetrics, kafka_query: str, typed_query: str) -> None:
        self.metrics = metrics
        self.kafka_query = kafka_query
        self.typed_query = typed_query
        self.typed_through: int | None = None
        self.typed_batches = 0

    def as_spark_listener(self) -> Any:
        from pyspark.sql.streaming.listener import StreamingQueryListener

        outer = self

        class Listener(StreamingQueryListener):
            def onQueryStarted(self, event: Any) -> None:
                pass

            def onQueryProgress(self, event: Any) -> None:
                try:
                    outer.progressed(json.loads(event.progress.json))
                except Exception as error:  # a metric must never stop the job
                    log.warning("progress not read: %s: %s", type(error).__name__, error)

            def onQueryIdle(self, event: Any) -> None:
                pass

            def onQueryTerminated(self, event: Any) -> None:
                pass

        return Listener()

    def progressed(self, progress: Mapping[str, Any]) -> None:
        """One query's progress report (Spark's ``StreamingQueryProgress`` as JSON)."""
        name = progress.get("name")
        for source in progress.get("sources") or ():
            end = _offsets(source.get("endOffset"))
            if name == self.kafka_query:
                latest = _offsets(source.get("latestOffset"))
                for topic, parts in latest.items():
                    for partition, offset in parts.items():
                        at = end.get(topic, {}).get(partition)
                        if at is not None:
                            self.metrics.lag.labels(topic, str(partition)).set(max(0, offset - at))
            elif name == self.typed_query:
                through = typed_through(end)
                if through is not None:
                    self.typed_through = max(self.typed_through or through, through)
                if progress.get("numInputRows"):
                    self.typed_batches += 1


def _batch_id(query: StreamingQuery) -> int | None:
    """The id of the query's last completed batch (None before any)."""
    last = query.lastProgress
    return None if not last else int(last["batchId"])


def _offsets(value: Any) -> dict[str, Any]:
    if isinstance(value, str):
        value = json.loads(value)
    return value if isinstance(value, dict) else {}


class Ingest:
    """The job on ``spark`` (the caller's session: it starts and stops it)."""

    def __init__(
        self,
        spark: SparkSession,
        settings: LakeSettings,
        kafka: KafkaSettings,
        metrics: LakeMetrics | None = None,
    ) -> None:
        self.spark = spark
        self.settings = settings
        self.kafka = kafka
        self.metrics = metrics or LakeMetrics()
        self.kafka_query_name = settings.query_name.replace("-", "_")
        self.typed_query_name = f"{self.kafka_query_name}_typed"
        self.listener = _Listener(self.metrics, self.kafka_query_name, self.typed_query_name)
        self.typed_checkpoint = settings.table_uri(f"_checkpoints/{settings.query_name}-typed")

    def run(self, stop: threading.Event, *, available_now: bool = False) -> None:
        """Ingest until ``stop`` is set (the batch under way lands first), or, with
        ``available_now``, until what Kafka holds now is in every table."""
        check_access(self.settings)  # a refused key is said now, not from a Spark job
        listener = self.listener.as_spark_listener()
        self.spark.streams.addListener(listener)
        guard = LogGuard(
            KafkaMetadata(self.kafka, self.settings.topic_pattern),
            self._read_range,
            self.settings.fail_on_data_loss,
        )
        try:
            started_over: frozenset[str] = frozenset()
            while True:
                try:
                    self._run_once(guard, stop, available_now, started_over)
                    return
                except _StartOver as again:
                    started_over = again.topics
        finally:
            guard.close()
            self.spark.streams.removeListener(listener)

    def _run_once(
        self,
        guard: LogGuard,
        stop: threading.Event,
        available_now: bool,
        started_over: frozenset[str],
    ) -> None:
        move_aside_earlier_checkpoint(self.settings)
        for location in (self.settings.checkpoint, self.typed_checkpoint):
            self._move_aside_if_incomplete(location)
        progress = earlier_progress(self.settings, lambda: list(guard.metadata.partitions()))
        decided, broker = guard.at_start(progress)
        if isinstance(decided, Refuse):
            raise DataLossError(decided.reason)
        reread = set(started_over)
        if isinstance(decided, StartOver):
            reread |= decided.topics
            self._move_checkpoint_aside(f"topics {', '.join(sorted(decided.topics))} replaced")
        starting = starting_offsets(progress.partitions, broker, frozenset(reread))
        sink = EventsSink(
            self.settings,
            progress,
            self.metrics,
            check=guard.before_batch,
            typed_through=lambda: self.listener.typed_through,
            started_over=frozenset(reread),
        )
        sink.create_tables()
        guard.stopped_by = None
        kafka_query = self._start_kafka_query(sink, starting, available_now)
        log.info("lake ingest started (checkpoint %s)", self.settings.checkpoint)
        typed_query = None
        try:
            if available_now:
                self._wait(kafka_query, stop)
                self._raise_if_failed(kafka_query, guard, sink)
                if stop.is_set():
                    return
                typed_query = self._start_typed_query(progress, available_now=True)
                self._wait(typed_query, stop)
                self._raise_if_failed(typed_query, guard, None)
                self._record_typed_progress(typed_query, sink)
                return
            typed_query = self._start_typed_query(progress, available_now=False)
            watched = KafkaMetadata(self.kafka, self.settings.topic_pattern, patience_seconds=0)
            try:
                next_watch = time.monotonic() + _WATCH_SECONDS
                while kafka_query.isActive and typed_query.isActive and not stop.is_set():
                    kafka_query.awaitTermination(1)
                    if time.monotonic() >= next_watch:
                        next_watch = time.monotonic() + _WATCH_SECONDS
                        if self._watched(guard, watched, sink) is not None:
                            break
            finally:
                watched.close()
            self._stop_after_the_batch(kafka_query, typed_query)
            self._act_on(guard)
            self._raise_if_failed(kafka_query, guard, sink)
            self._raise_if_failed(typed_query, guard, None)
            self._record_typed_progress(typed_query, sink)
        finally:
            for query in (kafka_query, typed_query):
                if query is not None and query.isActive:
                    query.stop()
        if stop.is_set():
            log.info("lake ingest stopped between two batches")

    # -- the queries ---------------------------------------------------------------------

    def _start_kafka_query(
        self, sink: EventsSink, starting: Mapping[str, Any], available_now: bool
    ) -> StreamingQuery:
        reader = self.spark.readStream.format("kafka")
        for name, value in kafka_options(self.settings, self.kafka).items():
            reader = reader.option(name, value)
        frame = (
            reader.option("subscribePattern", self.settings.topic_pattern)
            .option("startingOffsets", json.dumps(starting) if starting else "earliest")
            .option("maxOffsetsPerTrigger", str(self.settings.max_records_per_batch))
            .load()
        )
        # The contract is part of the query's plan, analysed once at its start: each batch
        # re-plans only the little the sink adds (0.2 s a batch otherwise).
        frame = read_contract(frame.select(*RAW_FIELDS))
        writer = (
            frame.writeStream.queryName(self.kafka_query_name)
            .foreachBatch(sink)
            .option("checkpointLocation", self.settings.checkpoint)
        )
        query: StreamingQuery = self._in_pool(FRESHNESS_POOL, self._trigger(writer, available_now))
        return query

    def _start_typed_query(self, progress: LakeProgress, *, available_now: bool) -> StreamingQuery:
        sink = TypedSink(self.settings, self.metrics, one_task=not available_now)
        reader = self.spark.readStream.format("delta").option("skipChangeCommits", "true")
        if not self._has_checkpoint(self.typed_checkpoint):
            start = self._typed_start(progress)
            if start is not None:
                reader = reader.option("startingVersion", str(start))
        writer = (
            reader.load(self.settings.table_uri(EVENTS_TABLE.name))
            .writeStream.queryName(self.typed_query_name)
            .foreachBatch(sink)
            .option("checkpointLocation", self.typed_checkpoint)
        )
        trigger = (
            writer.trigger(availableNow=True)
            if available_now
            else writer.trigger(processingTime=f"{self._typed_trigger_seconds()} seconds")
        )
        query: StreamingQuery = self._in_pool(TYPED_POOL, trigger)
        return query

    def _typed_trigger_seconds(self) -> float:
        """The typed query's interval: a few of the Kafka query's (its batches then carry
        more rows for the same fixed cost, and leave the cores to the freshness path)."""
        return max(TYPED_TRIGGER_SECONDS, self.settings.trigger_seconds)

    def _in_pool(self, pool: str, writer: Any) -> StreamingQuery:
        """Start the query in a scheduler pool (its thread inherits this local property)."""
        context = self.spark.sparkContext
        context.setLocalProperty("spark.scheduler.pool", pool)
        try:
            query: StreamingQuery = writer.start()
        finally:
            context.setLocalProperty("spark.scheduler.pool", None)  # type: ignore[arg-type]
        return query

    def _typed_start(self, progress: LakeProgress) -> int | None:
        """Where a typed query without a checkpoint starts reading ``events``: after the
        version the typed tables have reached; from version 0 on a lake whose log still
        holds it (every commit read as a change: offsets then say how far it has come);
        else (None) from a snapshot of the table."""
        if progress.typed_through is not None:
            return progress.typed_through + 1
        try:
            first = open_table(self.settings, self.settings.table_uri(EVENTS_TABLE.name), 0)
        except Exception:  # the log was cleaned up: no version 0 to read from
            return None
        return 0 if first is not None else None

    def _trigger(self, writer: Any, available_now: bool) -> Any:
        if available_now:
            return writer.trigger(availableNow=True)
        return writer.trigger(processingTime=f"{self.settings.trigger_seconds} seconds")

    def _read_range(
        self, starting: Mapping[str, Mapping[str, int]], ending: Mapping[str, Mapping[str, int]]
    ) -> DataFrame:
        """The records of the given partitions between two offsets each (a batch read)."""
        reader = self.spark.read.format("kafka")
        for name, value in kafka_options(self.settings, self.kafka).items():
            reader = reader.option(name, value)
        assign = {topic: [int(p) for p in parts] for topic, parts in starting.items()}
        return (
            reader.option("assign", json.dumps(assign))
            .option("startingOffsets", json.dumps(starting))
            .option("endingOffsets", json.dumps(ending))
            .load()
        )

    # -- the loop's actions --------------------------------------------------------------

    def _wait(self, query: StreamingQuery, stop: threading.Event) -> None:
        while query.isActive:
            query.awaitTermination(1)
            if stop.is_set():
                self._stop_after_the_batch(query)
                return

    def _raise_if_failed(
        self, query: StreamingQuery, guard: LogGuard, sink: EventsSink | None
    ) -> None:
        failed = query.exception()
        if failed is None:
            return
        self._act_on(guard)
        ours = getattr(sink, "failure", None)
        if isinstance(ours, OutboxError):
            raise ours from None
        raise failed

    def _watched(self, guard: LogGuard, metadata: KafkaMetadata, sink: EventsSink) -> Any:
        """The guard's verdict between batches; a broker that does not answer now is asked
        again at the next watch (the batches wait for it themselves)."""
        try:
            return guard.watch(metadata, sink.known())
        except OutboxError as error:
            log.warning("the topics were not checked against the lake's progress: %s", error)
            return None

    def _act_on(self, guard: LogGuard) -> None:
        """What the guard decided, done: stop with the loss, or start replaced topics over."""
        decided = guard.stopped_by
        if isinstance(decided, Refuse):
            raise DataLossError(decided.reason) from None
        if isinstance(decided, StartOver):
            self._move_checkpoint_aside(f"topics {', '.join(sorted(decided.topics))} replaced")
            raise _StartOver(decided.topics)

    def _record_typed_progress(self, typed_query: StreamingQuery, sink: EventsSink) -> None:
        """The typed query's last progress (read now, not from the listener's thread),
        recorded in ``events`` when it moved."""
        last = typed_query.lastProgress
        if last:
            self.listener.progressed(last)
        sink.record_typed_progress(self.spark)

    def _stop_after_the_batch(self, *queries: StreamingQuery) -> None:
        """Let the batch under way land (its commits are idempotent either way), then stop:
        as soon as a batch completes after the request, or between two triggers; a batch
        that started meanwhile is only reading, and is abandoned."""
        deadline = time.monotonic() + _STOP_PATIENCE_SECONDS
        for query in queries:
            done_before = _batch_id(query)
            while (
                query.isActive
                and query.status["isTriggerActive"]
                and _batch_id(query) == done_before
                and time.monotonic() < deadline
            ):
                time.sleep(0.05)
            query.stop()

    def _has_checkpoint(self, location: str) -> bool:
        if not self.settings.is_local:
            return False  # Spark decides; the option is ignored when one exists
        return (Path(location) / "offsets").is_dir()

    def _move_aside_if_incomplete(self, location: str) -> None:
        """A checkpoint without its ``metadata`` file but with offsets or commits, as a
        deletion under the running job leaves it (the job wrote on while the folder went):
        Spark refuses to start from it. Moved aside (kept for inspection), as if deleted,
        which is safe (docs/operations.md, "The lake job"): the query starts where the
        lake's tables stand. A store other than a folder: Spark's error says what to do."""
        if not self.settings.is_local:
            return
        folder = Path(location)
        if (folder / "metadata").exists():
            return
        if not any((folder / part).is_dir() for part in ("offsets", "commits", "sources")):
            return
        aside = move_aside(folder, "incomplete")
        log.warning(
            "the checkpoint %s has no metadata file (deleted in part, under the running "
            "job?): moved to %s; the query starts where the lake's tables stand",
            folder,
            aside,
        )

    def _move_checkpoint_aside(self, why: str) -> None:
        """The Kafka query's checkpoint holds offsets of a log that is gone: moved aside
        (kept for inspection), so the query starts where the lake's progress says."""
        if not self.settings.is_local:
            if has_folder(self.settings, f"_checkpoints/{self.settings.query_name}"):
                raise DataLossError(
                    f"{why}: delete the Kafka query's checkpoint {self.settings.checkpoint} "
                    "and start the job again (it starts where the lake's tables stand)"
                )
            return
        folder = Path(self.settings.checkpoint)
        if folder.exists():
            aside = move_aside(folder, "replaced")
            log.warning("%s: the checkpoint %s was moved to %s", why, folder, aside)


class _StartOver(Exception):
    def __init__(self, topics: frozenset[str]) -> None:
        super().__init__(", ".join(sorted(topics)))
        self.topics = topics
