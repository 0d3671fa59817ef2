"""The ingest job: Kafka → Spark's Kafka source → (parse, type, dedup on the executors) → Delta.

- **Source**: Spark's own ``format("kafka")`` (``spark-sql-kafka-0-10``), committed records
  only (``kafka.isolation.level=read_committed``), topics by ``subscribePattern`` (new topics
  are picked up without a restart), ``maxOffsetsPerTrigger`` for admission control and Spark's
  ``failOnDataLoss`` for records deleted by retention and partitions that shrank.
- **What Spark's source does not tell** (a topic deleted, recreated and refilled past where
  the lake stood; a broker replaced under the lake): :class:`LogGuard` compares the broker
  with the lake's ``_progress`` (:mod:`outbox_lake.offsets`) at start and before every batch.
  ``OUTBOX_LAKE_FAIL_ON_DATA_LOSS`` decides: stop with an error that names topic, partition
  and offsets, or go on, read the new log from its start, and log what was skipped.
- **Sink**: :class:`outbox_lake.spark_sink.SparkDeltaSink`, Delta's Spark writer; the
  executors write every row, the driver sees only each batch's shape.
- **No checkpoint** (a new lake, a deleted or renamed checkpoint, a lake of an earlier
  release): the query starts where ``_progress`` says, every other partition from its start.

On object storage (an ``s3://`` or ``s3a://`` root) Spark writes through S3A
(:func:`outbox_lake.storage.hadoop_conf`), credentials from the AWS variables of the
environment only; one job per lake root (docs/production.md, "The lake on object storage").

Spark's jars come from ``OUTBOX_LAKE_SPARK_JARS`` (local files: the CLI resolves them from
the project's pinned Maven list) or ``OUTBOX_LAKE_SPARK_PACKAGES`` (Maven coordinates), or
are already on the cluster's class path (``spark-submit --packages``).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from outbox.core.errors import DataLossError
from outbox.kafka_clients import spark_options
from outbox.settings import KafkaSettings, kafka_settings
from outbox_lake.kafka_metadata import LAKE_CLIENT_ID, PATIENCE_SECONDS, KafkaMetadata
from outbox_lake.metrics import LakeMetrics
from outbox_lake.offsets import (
    BrokerPartition,
    Partition,
    Progress,
    fingerprint,
    is_replaced_topic,
    loss_message,
    losses,
    replaced_topics,
    starting_offsets,
)
from outbox_lake.progress import ProgressStore
from outbox_lake.settings import LakeSettings
from outbox_lake.spark_sink import BatchShape, SparkDeltaSink
from outbox_lake.storage import check_access, hadoop_conf

__all__ = ["LogGuard", "kafka_options", "read_stream", "run_ingest", "spark_session"]

log = logging.getLogger("outbox.lake.job")

_LOG4J2 = Path(__file__).with_name("log4j2.properties")
SPARK_REDACTION_REGEX = r"(?i)secret|password|token|access[.]?key|jaas|ssl[.]keystore[.]key|url"


def spark_session(settings: LakeSettings) -> Any:
    """The job's Spark session. Spark's JVM runs in a session (process group) of its own:
    a SIGTERM or Ctrl-C sent to the job's process group reaches the driver only, which
    finishes the batch under way and stops the JVM itself (it also exits when the driver
    dies: its standard input closes)."""
    from pyspark import SparkConf, SparkContext
    from pyspark.java_gateway import launch_gateway
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    # Loopback only: otherwise the driver resolves the hostname and listens on eth0. The
    # variable reaches the JVM Spark starts (and its executors), the settings the driver.
    os.environ.setdefault("SPARK_LOCAL_IP", settings.spark_bind_address)
    conf = (
        SparkConf()
        .setMaster(settings.spark_master)
        .setAppName(settings.query_name)
        .set("spark.sql.shuffle.partitions", "2")
        .set("spark.ui.enabled", "false")
        .set("spark.ui.showConsoleProgress", "false")
        .set("spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile={_LOG4J2}")
        .set("spark.driver.host", settings.spark_bind_address)
        .set("spark.driver.bindAddress", settings.spark_bind_address)
        .set("spark.sql.session.timeZone", "UTC")
        # Kafka's security options carry the SASL password (in the JAAS line) and a client
        # key inline: redacted wherever Spark shows options (plans, logs, the UI).
        .set("spark.redaction.regex", SPARK_REDACTION_REGEX)
        .set("spark.sql.redaction.options.regex", SPARK_REDACTION_REGEX)
        .set("spark.driver.memory", "1g")
        .set("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
        .set("spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog")
        # Small tables, small batches: Delta's log replay and merges on few tasks.
        .set("spark.databricks.delta.snapshotPartitions", "2")
        # The merge's source is already persisted by the sink: no second copy of it.
        .set("spark.databricks.delta.merge.materializeSource", "none")
        .set("spark.databricks.delta.merge.repartitionBeforeWrite.enabled", "false")
        .set("spark.sql.adaptive.coalescePartitions.initialPartitionNum", "2")
        # A trigger with no new data reports progress at once (the demo waits for one).
        .set("spark.sql.streaming.noDataProgressEventInterval", "500ms")
    )
    for name, value in hadoop_conf(settings).items():  # s3:// roots; never a credential
        conf.set(name, value)
    if settings.spark_jars:
        conf.set("spark.jars", settings.spark_jars)
    if settings.spark_packages:
        conf.set("spark.jars.packages", settings.spark_packages)
    if SparkContext._gateway is None:
        gateway = launch_gateway(conf, popen_kwargs={"start_new_session": True})  # type: ignore[no-untyped-call]
        SparkContext._ensure_initialized(gateway=gateway, conf=conf)
    spark = SparkSession.builder.config(conf=conf).getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark


def kafka_options(settings: LakeSettings, kafka: KafkaSettings | str) -> dict[str, str]:
    """The options of every read of Kafka by Spark (the stream, and a range read again): the
    cluster and its security as ``OUTBOX_KAFKA_*`` say (:func:`spark_options`; secrets
    inline, never logged), committed records only."""
    return {
        **spark_options(kafka_settings(kafka)),
        "kafka.isolation.level": "read_committed",
        "kafka.client.id": LAKE_CLIENT_ID,
        # The consumers' group ids start so: a prefixed group ACL covers them.
        "groupIdPrefix": LAKE_CLIENT_ID,
        "includeHeaders": "true",
        "failOnDataLoss": str(settings.fail_on_data_loss).lower(),
        # A broker that does not answer for a while is waited for, not data loss.
        "kafka.request.timeout.ms": "30000",
        "kafka.default.api.timeout.ms": str(int(PATIENCE_SECONDS * 1000)),
    }


def read_stream(
    spark: Any, settings: LakeSettings, kafka: KafkaSettings | str, starting: Mapping[str, Any]
) -> Any:
    reader = spark.readStream.format("kafka")
    for name, value in kafka_options(settings, kafka).items():
        reader = reader.option(name, value)
    return (
        reader.option("subscribePattern", settings.topic_pattern)
        .option("startingOffsets", json.dumps(starting) if starting else "earliest")
        .option("maxOffsetsPerTrigger", str(settings.max_records_per_batch))
        .load()
    )


def read_range(
    spark: Any,
    settings: LakeSettings,
    kafka: KafkaSettings | str,
    starting: Mapping[str, Mapping[str, int]],
    ending: Mapping[str, Mapping[str, int]],
) -> Any:
    """The records of the given partitions between two offsets each (a batch read)."""
    reader = spark.read.format("kafka")
    for name, value in kafka_options(settings, kafka).items():
        reader = reader.option(name, value)
    assign = {topic: [int(p) for p in parts] for topic, parts in starting.items()}
    return (
        reader.option("assign", json.dumps(assign))
        .option("startingOffsets", json.dumps(starting))
        .option("endingOffsets", json.dumps(ending))
        .option("failOnDataLoss", "false")
        .load()
    )


class LogGuard:
    """The data-loss checks Spark's source does not make, against the lake's progress."""

    def __init__(
        self,
        spark: Any,
        settings: LakeSettings,
        kafka: KafkaSettings,
        store: ProgressStore,
        sink: SparkDeltaSink,
    ) -> None:
        self.spark = spark
        self.settings = settings
        self.kafka = kafka
        self.store = store
        self.sink = sink
        self.metadata = KafkaMetadata(kafka, settings.topic_pattern)

    def at_start(self) -> dict[str, dict[str, int]]:
        """Check the broker against the lake's progress; the query's starting offsets (used
        when it has no checkpoint)."""
        broker = self.metadata.partitions()
        progress = self.store.read(legacy_partitions=broker)
        progress = _with_legacy_ids(progress, _legacy_checkpoint(self.settings))
        before = self._records_before(progress, broker)
        found = losses(progress, broker, before)
        reread = self._decide(found, broker)
        self.store.topic_ids.update({where.topic: b.topic_id for where, b in broker.items()})
        return starting_offsets(self.store.known, broker, reread)

    def before_batch(self, spark: Any, shape: BatchShape) -> None:
        """``before_write`` of the sink: is each topic of the batch still the one read?"""
        topics = sorted({where.topic for where in shape.ends})
        ids = self.metadata.topic_ids(topics)
        known = self.store.known
        replaced = []
        for topic in topics:
            now = BrokerPartition(0, 0, ids.get(topic))
            was = next((p for w, p in known.items() if w.topic == topic and p.topic_id), None)
            if was is not None and is_replaced_topic(was, now):
                replaced.append(topic)
            elif ids.get(topic) is not None:
                self.store.topic_ids[topic] = ids[topic]
        if not replaced:
            self._count_retention_gaps(shape)
            return
        broker = {w: b for w, b in self.metadata.partitions().items() if w.topic in replaced}
        found = losses({w: p for w, p in known.items() if w.topic in replaced}, broker)
        self._decide(found, broker)

    def _decide(self, found: list[Any], broker: Mapping[Partition, BrokerPartition]) -> set[str]:
        """Refuse (fail on data loss), or log what is skipped and read each replaced topic
        again from its start; the topics read again."""
        if not found:
            return set()
        if self.settings.fail_on_data_loss:
            raise DataLossError("; ".join(loss_message(loss) for loss in found))
        for loss in found:
            counted = f" ({loss.skipped} offsets)" if loss.skipped else ""
            log.error(
                "data loss skipped (OUTBOX_LAKE_FAIL_ON_DATA_LOSS=false): %s: %s%s",
                loss.partition,
                loss.what,
                counted,
            )
        reread = replaced_topics(found)
        for topic in sorted(reread):
            topic_id = next((b.topic_id for w, b in broker.items() if w.topic == topic), None)
            self.store.forget_topic(topic, topic_id)
            self._read_topic_again(topic, broker)
        return reread

    def _read_topic_again(self, topic: str, broker: Mapping[Partition, BrokerPartition]) -> None:
        parts = {w: b for w, b in broker.items() if w.topic == topic and b.latest > b.earliest}
        if not parts:
            return
        starting = {topic: {str(w.partition): b.earliest for w, b in parts.items()}}
        ending = {topic: {str(w.partition): b.latest for w, b in parts.items()}}
        log.warning("reading %s again from its start: %s to %s", topic, starting, ending)
        frame = read_range(self.spark, self.settings, self.kafka, starting, ending)
        self.sink.write_batch(frame, -1)

    def _records_before(
        self, progress: Mapping[Partition, Progress], broker: Mapping[Partition, BrokerPartition]
    ) -> dict[Partition, str | None]:
        """The fingerprint of the record at each partition's ``end_offset - 1`` now, for the
        partitions whose progress has one (None: no record there); one Spark read."""
        wanted = {
            w: p.end_offset - 1
            for w, p in progress.items()
            if p.last_record and w in broker and broker[w].earliest <= p.end_offset - 1
        }
        found: dict[Partition, str | None] = {w: None for w in wanted}
        if not wanted:
            return found
        starting: dict[str, dict[str, int]] = {}
        ending: dict[str, dict[str, int]] = {}
        for w, at in wanted.items():
            starting.setdefault(w.topic, {})[str(w.partition)] = at
            ending.setdefault(w.topic, {})[str(w.partition)] = min(at + 1, broker[w].latest)
        ending = {
            t: {p: e for p, e in parts.items() if e > starting[t][p]} for t, parts in ending.items()
        }
        starting = {t: {p: starting[t][p] for p in parts} for t, parts in ending.items() if parts}
        ending = {t: parts for t, parts in ending.items() if parts}
        if not starting:
            return found
        frame = read_range(self.spark, self.settings, self.kafka, starting, ending)
        for row in frame.select(
            "topic", "partition", "offset", "timestamp", "key", "value", "headers"
        ).collect():  # at most one record per partition
            w = Partition(row["topic"], int(row["partition"]))
            if wanted.get(w) == row["offset"]:
                headers = [(h["key"], h["value"]) for h in row["headers"] or []]
                stamp = int(row["timestamp"].timestamp() * 1000)
                found[w] = fingerprint(stamp, row["key"], row["value"], headers)
        return found

    def _count_retention_gaps(self, shape: BatchShape) -> None:
        """With fail-on-data-loss off, Spark skips records deleted by retention: log how many."""
        if self.settings.fail_on_data_loss:
            return
        known = self.store.known
        gaps = [
            w for w, start in shape.starts.items() if w in known and start > known[w].end_offset
        ]
        if not gaps:
            return
        broker = self.metadata.partitions()
        for loss in losses({w: known[w] for w in gaps}, broker):
            log.error(
                "data loss skipped (OUTBOX_LAKE_FAIL_ON_DATA_LOSS=false): %s: %s (%s offsets)",
                loss.partition,
                loss.what,
                loss.skipped,
            )

    def close(self) -> None:
        self.metadata.close()


def _legacy_checkpoint(settings: LakeSettings) -> dict[str, str]:
    """A checkpoint of an earlier release (our own Python source): moved aside, its topics'
    ids returned. Spark's Kafka source cannot read its offsets; the query starts where the
    lake's tables say instead."""
    if not settings.is_local:
        return {}
    folder = Path(settings.checkpoint)
    offsets = folder / "offsets"
    if not offsets.is_dir() or (folder / "sources" / "0" / "0").exists():
        return {}
    ids: dict[str, str] = {}
    numbered = [f for f in offsets.iterdir() if f.name.isdigit()]
    if numbered:
        last = max(numbered, key=lambda f: int(f.name))
        try:
            kept = json.loads(last.read_text().splitlines()[-1])
            ids = {str(k): str(v) for k, v in (kept.get("@topic_ids") or {}).items()}
        except (ValueError, IndexError, AttributeError):
            ids = {}
    aside = folder.with_name(f"{folder.name}.python-source-{int(time.time())}")
    shutil.move(str(folder), str(aside))
    log.warning(
        "the checkpoint %s was written by an earlier release's Kafka source: moved to %s; "
        "the job starts where the lake's tables stand",
        folder,
        aside,
    )
    return ids


def _with_legacy_ids(
    progress: dict[Partition, Progress], ids: Mapping[str, str]
) -> dict[Partition, Progress]:
    return {
        w: Progress(p.end_offset, p.topic_id or ids.get(w.topic), p.last_record)
        for w, p in progress.items()
    }


def run_ingest(
    settings: LakeSettings,
    kafka: KafkaSettings | str,
    *,
    available_now: bool,
    spark: Any = None,
    sink: Any = None,
) -> None:
    """Run the query: until caught up (``available_now``), or until stopped. ``kafka``: the
    cluster (``OUTBOX_KAFKA_*``, security included; a plain ``host:port,...`` string is one
    without security). ``sink``: a ``foreachBatch`` callable instead of the lake's (a
    benchmark's baseline)."""
    kafka = kafka_settings(kafka)
    check_access(settings)  # a refused key is said now, not from inside a Spark job
    own_session = spark is None
    spark = spark or spark_session(settings)
    metrics = LakeMetrics()
    store = ProgressStore(settings)
    batch_sink = sink
    lake = SparkDeltaSink(settings, metrics, store)
    guard = LogGuard(spark, settings, kafka, store, lake)
    lake.before_write = guard.before_batch
    server = _serve_metrics(settings, metrics)
    stop = _StopOnSignal()
    # The lag metric never waits for the broker: it must not hold a stop request.
    lag = _Lag(KafkaMetadata(kafka, settings.topic_pattern, patience_seconds=0), metrics)
    try:
        starting = guard.at_start()
        writer = (
            read_stream(spark, settings, kafka, starting)
            .writeStream.queryName(settings.query_name.replace("-", "_"))
            .foreachBatch(batch_sink if batch_sink is not None else lake.write_batch)
            .option("checkpointLocation", settings.checkpoint)
        )
        if available_now:
            writer = writer.trigger(availableNow=True)
        else:
            writer = writer.trigger(processingTime=f"{settings.trigger_seconds} seconds")
        query = writer.start()
        log.info("lake ingest started (checkpoint %s)", settings.checkpoint)
        while query.isActive:
            query.awaitTermination(0.5)
            if stop.requested:
                _stop_after_the_batch(query, metrics)
            else:
                lag.update(query.lastProgress)
    finally:
        stop.restore()
        lag.close()
        guard.close()
        if server is not None:
            server.shutdown()
    failed = query.exception()
    if own_session:
        spark.stop()
    if failed is not None:
        raise failed
    if stop.requested:
        log.info("lake ingest stopped on %s, between two batches", stop.requested)


def _serve_metrics(settings: LakeSettings, metrics: LakeMetrics) -> Any:
    if not settings.metrics_port:
        return None
    from prometheus_client import start_http_server

    server, _thread = start_http_server(
        settings.metrics_port, addr=settings.metrics_address, registry=metrics.registry
    )
    log.info("metrics on http://%s:%d/metrics", settings.metrics_address, settings.metrics_port)
    return server


class _Lag:
    """Consumer lag per partition, every few seconds: the broker's end offsets (committed
    records) less the query's last end offsets."""

    def __init__(self, metadata: KafkaMetadata, metrics: LakeMetrics):
        self._metadata = metadata
        self._metrics = metrics
        self._next = 0.0

    def update(self, progress: Any) -> None:
        if progress is None or time.monotonic() < self._next:
            return
        self._next = time.monotonic() + 10.0
        try:
            self._measure(progress)
        except Exception as error:  # a metric must never stop the job
            log.warning("consumer lag not measured: %s", f"{type(error).__name__}: {error}")

    def _measure(self, progress: Any) -> None:
        at: dict[Partition, int] = {}
        for source in progress["sources"]:
            offsets = source.get("endOffset") or {}
            offsets = json.loads(offsets) if isinstance(offsets, str) else offsets
            for topic, parts in offsets.items():
                for partition, offset in parts.items():
                    at[Partition(topic, int(partition))] = int(offset)
        if not at:
            return
        for where, end in self._metadata.ends(list(at)).items():
            self._metrics.lag.labels(where.topic, str(where.partition)).set(max(0, end - at[where]))

    def close(self) -> None:
        self._metadata.close()


class _StopOnSignal:
    """SIGTERM and SIGINT ask for a clean stop (the handler only notes it)."""

    def __init__(self) -> None:
        self.requested: str | None = None
        self._previous: dict[int, Any] = {}
        if threading.current_thread() is threading.main_thread():
            for number in (signal.SIGTERM, signal.SIGINT):
                self._previous[number] = signal.signal(number, self._note)

    def _note(self, number: int, _frame: Any) -> None:
        self.requested = signal.Signals(number).name

    def restore(self) -> None:
        for number, handler in self._previous.items():
            signal.signal(number, handler)


def _stop_after_the_batch(
    query: Any, metrics: LakeMetrics, patience_seconds: float = 120.0
) -> None:
    """Let the batch under way land (its commits are idempotent either way), then stop.

    Stopped as soon as a batch completes after the request, or between two triggers; the
    batch that may have started meanwhile is only reading Kafka, and is abandoned."""
    done_before = metrics.completed_batches
    deadline = time.monotonic() + patience_seconds
    while (
        query.isActive
        and query.status["isTriggerActive"]
        and metrics.completed_batches == done_before
        and time.monotonic() < deadline
    ):
        time.sleep(0.05)
    query.stop()
