"""The ingest job: Kafka → (parse, validate, dedup in Spark) → Delta tables, exactly once.

The source and the sink are two small seams:

- ``read_raw(spark, settings, bootstrap)`` returns a streaming DataFrame: with
  ``source="kafka"``, Spark's own ``format("kafka")`` (where the ``spark-sql-kafka`` jar is
  on the class path; raw Kafka columns, parsed by the sink on the executors); by default our
  Python source, which parses while it reads (one pass over the records, Arrow batches);
- the sink is any ``foreachBatch`` callable; :class:`outbox_lake.delta_sink.DeltaSink` writes with
  ``deltalake``; a cluster with Delta's Spark writer can pass its own.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from outbox_lake.delta_sink import DeltaSink
from outbox_lake.kafka_source import OutboxKafkaSource, positions_of
from outbox_lake.metrics import LakeMetrics
from outbox_lake.settings import LakeSettings

__all__ = ["read_raw", "run_ingest", "spark_session"]

log = logging.getLogger("outbox.lake.job")

_LOG4J2 = Path(__file__).with_name("log4j2.properties")


def spark_session(settings: LakeSettings) -> Any:
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    # Loopback only: otherwise the driver resolves the hostname and listens on eth0. The
    # variable reaches the JVM Spark starts (and its executors), the settings the driver.
    os.environ.setdefault("SPARK_LOCAL_IP", settings.spark_bind_address)
    spark = (
        SparkSession.builder.master(settings.spark_master)
        .appName(settings.query_name)
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile={_LOG4J2}")
        .config("spark.driver.host", settings.spark_bind_address)
        .config("spark.driver.bindAddress", settings.spark_bind_address)
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.memory", "1g")
        # A trigger with no new data reports progress at once: --available-now stops on it.
        .config("spark.sql.streaming.noDataProgressEventInterval", "500ms")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("WARN")
    spark.dataSource.register(OutboxKafkaSource)
    return spark


def read_raw(
    spark: Any, settings: LakeSettings, bootstrap_servers: str, source: str = "python"
) -> Any:
    if source == "kafka":  # Spark's own source, where its jar is available
        return (
            spark.readStream.format("kafka")
            .option("kafka.bootstrap.servers", bootstrap_servers)
            .option("subscribePattern", settings.topic_pattern)
            .option("startingOffsets", "earliest")
            .option("maxOffsetsPerTrigger", settings.max_records_per_batch)
            .option("failOnDataLoss", str(settings.fail_on_data_loss).lower())
            .option("includeHeaders", "true")
            .load()
            .select("key", "value", "topic", "partition", "offset", "timestamp", "headers")
        )
    return (
        spark.readStream.format(OutboxKafkaSource.name())
        .option("bootstrapServers", bootstrap_servers)
        .option("pattern", settings.topic_pattern)
        .option("maxRecordsPerBatch", str(settings.max_records_per_batch))
        .option("maxBytesPerBatch", str(settings.max_bytes_per_batch))
        .option("failOnDataLoss", str(settings.fail_on_data_loss).lower())
        .option("endOffsets", settings.end_offsets)
        .option("parse", "true")
        .load()
    )


def run_ingest(
    settings: LakeSettings,
    bootstrap_servers: str,
    *,
    available_now: bool,
    sink: Callable[[Any, int], None] | None = None,
    spark: Any = None,
) -> None:
    """Run the query: until caught up (``available_now``), or until stopped."""
    spark = spark or spark_session(settings)
    metrics = LakeMetrics()
    write = sink or DeltaSink(settings, metrics).write_spark_batch
    server = _serve_metrics(settings, metrics)
    writer = (
        read_raw(spark, settings, bootstrap_servers)
        .writeStream.queryName(settings.query_name.replace("-", "_"))
        .foreachBatch(write)
        .option("checkpointLocation", settings.checkpoint)
    )
    if available_now:
        # Not Trigger.AvailableNow: Spark hands a Python source "read all available" then,
        # one unbounded batch. Micro-batches within the limit, stopped once caught up.
        writer = writer.trigger(processingTime="0 seconds")
    else:
        writer = writer.trigger(processingTime=f"{settings.trigger_seconds} seconds")
    query = writer.start()
    log.info("lake ingest started (checkpoint %s)", settings.checkpoint)
    stop = _StopOnSignal()
    lag = _Lag(settings, bootstrap_servers, metrics)
    try:
        while query.isActive:
            query.awaitTermination(0.5)
            if stop.requested:
                _stop_after_the_batch(query, metrics)
            elif available_now and _caught_up(query):
                query.stop()
            else:
                lag.update(query.lastProgress)
    finally:
        stop.restore()
        lag.close()
        if server is not None:
            server.shutdown()
    if query.exception() is not None:
        raise query.exception()
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
    """Consumer lag per partition, every few seconds, where broker end offsets are trusted."""

    def __init__(self, settings: LakeSettings, bootstrap_servers: str, metrics: LakeMetrics):
        self._on = settings.end_offsets == "broker"
        self._bootstrap = bootstrap_servers
        self._metrics = metrics
        self._next = 0.0
        self._consumer: Any = None

    def update(self, progress: Any) -> None:
        if not self._on or progress is None or time.monotonic() < self._next:
            return
        self._next = time.monotonic() + 10.0
        try:
            self._measure(progress)
        except Exception as error:  # a metric must never stop the job
            log.warning("consumer lag not measured: %s", f"{type(error).__name__}: {error}")

    def _measure(self, progress: Any) -> None:
        import json

        from kafka import KafkaConsumer, TopicPartition

        at: dict[Any, int] = {}
        for source in progress["sources"]:
            offsets = source.get("endOffset") or {}
            offsets = json.loads(offsets) if isinstance(offsets, str) else offsets
            for topic, parts in positions_of(offsets).items():
                for partition, offset in parts.items():
                    at[TopicPartition(topic, int(partition))] = int(offset)
        if not at:
            return
        if self._consumer is None:
            self._consumer = KafkaConsumer(
                bootstrap_servers=self._bootstrap.split(","),
                isolation_level="read_committed",
                group_id=None,
                client_id="outbox-lake",
                metrics_enabled=False,
            )
        for tp, end in self._consumer.end_offsets(list(at)).items():
            self._metrics.lag.labels(tp.topic, str(tp.partition)).set(max(0, end - at[tp]))

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()


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


def _caught_up(query: Any) -> bool:
    """The query's last trigger found no new data (a no-data progress)."""
    progress = query.lastProgress
    return (
        progress is not None
        and progress["numInputRows"] == 0
        and all(
            source["startOffset"] in (None, source["endOffset"]) for source in progress["sources"]
        )
    )
