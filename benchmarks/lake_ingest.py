"""Lake ingest: dedup cost, table-size sensitivity, driver CPU and commit-to-queryable latency.

Prints, from one run on the native stack (PostgreSQL and the local broker, started if
needed; Spark in local mode with Spark's Kafka source and Delta's Spark writer):

1. ingest events per second over ``--events`` (100,000) events already on Kafka, through the
   job with its dedup (insert-only MERGE per table, on the executors) and with a plain
   Delta append of the same parsed records, and the ratio of their times (target: dedup
   <= 1.5x append); and the Python driver's CPU seconds per 100,000 events of the dedup run
   (the driver collects no row: what is left is planning, a small aggregate per batch and
   the progress commit);
2. the time of one batch of 10,000 new events written by the sink when ``events`` holds
   100,000 rows and when it holds 1,000,000 (spread over 30 days, the batches in today's
   partition; median of 5 batches), and their ratio (target <= 1.2);
3. commit-to-queryable latency p50/p95 at a steady ``--rates`` (1,000 and 10,000 events/s)
   for ``--seconds`` each with the default trigger: from the SDK commit to the event being
   readable from the lake with ``deltalake`` (targets p95 < 2 s at 1,000, < 3 s at 10,000).
   Events reach Kafka through the polling relay.

    python -m benchmarks.lake_ingest                     # about 6 minutes
    python -m benchmarks.lake_ingest --events 20000 --big-rows 200000 --seconds 20
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import tempfile
import threading
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake
from kafka import KafkaProducer

from benchmarks._results import Results
from benchmarks._shared import fresh_database, paced_writes, percentile, postgres_and_broker
from outbox import OutboxSettings, new_event_id
from outbox.core.contract import record_for
from outbox_lake.job import read_stream, run_ingest, spark_session
from outbox_lake.settings import LakeSettings
from outbox_lake.spark_sink import SparkDeltaSink, parsed_frame
from outbox_lake.tables import EVENTS_TABLE
from outbox_relay.service import Relay
from outbox_relay.settings import RelaySettings
from outbox_stack.artifacts import spark_extra_jars
from outbox_stack.local import LocalStack
from outbox_stack.settings import StackSettings

DATABASE = "outbox_bench_lake"


def produce(bootstrap: str, aggregate_type: str, events: int) -> None:
    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=5, batch_size=262_144)
    for n in range(events):
        record = record_for(
            event_id=new_event_id(),
            aggregate_type=aggregate_type,
            aggregate_id=str(n % 500),
            event_type="Tick",
            payload_text=f'{{"n": {n}, "name": "item-{n % 97}", "price": {n % 1000}.5}}',
            headers_text="{}",
            traceparent="",
            position=n + 1,
        )
        producer.send(
            record.topic, key=record.key, value=record.value, headers=list(record.headers)
        )
    producer.flush()
    producer.close()


EVENTS_SCHEMA = EVENTS_TABLE.arrow_schema()


def lake_settings(**values: Any) -> LakeSettings:
    """Settings with the project's Spark jars (Kafka source, Delta writer)."""
    jars = ",".join(map(str, spark_extra_jars(StackSettings().downloads_root)))
    return LakeSettings(spark_jars=jars, **values)


class AppendSink:
    """The baseline: the same parsed rows, appended by the executors with no dedup."""

    def __init__(self, settings: LakeSettings) -> None:
        self.settings = settings

    def __call__(self, frame: Any, batch_id: int) -> None:
        from pyspark.sql import functions as f

        rows = (
            parsed_frame(frame)
            .where("kind = 'event'")
            .withColumn("ingest_time", f.current_timestamp())
        )
        rows.select(*EVENTS_TABLE.names).write.format("delta").mode("append").partitionBy(
            "event_date"
        ).save(self.settings.table_uri("events"))


def _cpu_seconds() -> float:
    times = os.times()
    return times.user + times.system


def ingest_rate(
    spark: Any, settings: LakeSettings, bootstrap: str, sink: Any, events: int
) -> tuple[float, float]:
    """(events per second, the Python driver's CPU seconds per 100,000 events)."""
    started = time.monotonic()
    cpu = _cpu_seconds()
    run_ingest(settings, bootstrap, available_now=True, sink=sink, spark=spark)
    cpu = _cpu_seconds() - cpu
    elapsed = time.monotonic() - started
    landed = DeltaTable(settings.table_uri("events")).to_pyarrow_dataset().count_rows()
    if landed != events:
        raise RuntimeError(f"{landed} rows landed of {events}")
    return events / elapsed, cpu * 100_000 / events


def synthetic(rows: int, start: datetime, days: int) -> pa.Table:
    ids, times = [], []
    for n in range(rows):
        moment = start + timedelta(seconds=(n * days * 86_400) // rows)
        millis = int(moment.timestamp() * 1000)
        value = (millis << 80) | (0x7 << 76) | (uuid.uuid4().int & ((1 << 76) - 1))
        value = (value & ~(0x3 << 62)) | (0x2 << 62)
        ids.append(str(uuid.UUID(int=value)))
        times.append(moment)
    return pa.table(
        {
            "event_id": ids,
            "aggregate_type": ["bench"] * rows,
            "aggregate_id": [str(n % 500) for n in range(rows)],
            "event_type": ["Tick"] * rows,
            "payload": ['{"n":1}'] * rows,
            "headers": ["{}"] * rows,
            "traceparent": [None] * rows,
            "position": list(range(1, rows + 1)),
            "event_time": times,
            "event_date": [moment.date() for moment in times],
            "topic": ["outbox.event.bench"] * rows,
            "partition": [0] * rows,
            "offset": list(range(rows)),
            "ingest_time": times,
        }
    ).cast(EVENTS_SCHEMA)


def batch_time(spark: Any, root: Path, existing: int, batches: int = 5) -> float:
    """Median seconds for the sink to write a batch of 10,000 new events into ``events``
    holding ``existing`` rows (``batches`` batches, one after the other)."""
    settings = lake_settings(root=str(root))
    now = datetime.now(UTC)
    write_deltalake(
        settings.table_uri("events"),
        synthetic(existing, now - timedelta(days=30), 30),
        partition_by=["event_date"],
    )
    sink = SparkDeltaSink(settings)
    times = []
    for batch_id in range(1, batches + 1):
        batch = synthetic(10_000, now, 0)
        frame = spark.createDataFrame(batch.to_pandas()).persist()  # the benchmark's rows
        frame.count()
        ids = batch.column("event_id")
        started = time.monotonic()
        sink._merge(  # the events table's merge: the batch's days and id range
            spark,
            EVENTS_TABLE,
            settings.table_uri("events"),
            frame,
            days={now.date()},
            ids=(min(ids.to_pylist()), max(ids.to_pylist())),
            batch_id=batch_id,
        )
        times.append(time.monotonic() - started)
        frame.unpersist()
    return sorted(times)[len(times) // 2]


def latency(
    spark: Any,
    stack: LocalStack,
    url: str,
    conninfo: str,
    root: Path,
    seconds: float,
    rate: int,
) -> list[float]:
    aggregate_type = f"lat{uuid.uuid4().hex[:8]}"
    settings = lake_settings(root=str(root), topic_pattern=rf"^outbox\.event\.{aggregate_type}$")
    relay = Relay(
        RelaySettings(http_port=0, idle_seconds=0.02),
        database_url=url,
        kafka=stack.bootstrap_servers,
        tables=OutboxSettings().tables,
    )
    stop_relay = threading.Event()
    relay_thread = threading.Thread(target=relay.run, args=(stop_relay,))
    relay_thread.start()
    query_box: dict[str, Any] = {}

    def ingest() -> None:
        query_box["query"] = (
            read_stream(spark, settings, stack.bootstrap_servers, {})
            .writeStream.foreachBatch(SparkDeltaSink(settings).write_batch)
            .option("checkpointLocation", settings.checkpoint)
            .trigger(processingTime=f"{settings.trigger_seconds} seconds")
            .start()
        )

    ingest()
    commit_times: dict[uuid.UUID, float] = {}
    seen: dict[str, float] = {}
    paced_writes(  # rate/100 events every 10 ms
        conninfo,
        aggregate_type,
        commit_times,
        events_per_tick=max(1, rate // 100),
        seconds=seconds,
        every_100_ticks=lambda: _look(settings, seen),
    )
    committed = {str(event_id): moment for event_id, moment in commit_times.items()}
    deadline = time.monotonic() + 120
    while len(seen) < len(committed) and time.monotonic() < deadline:
        _look(settings, seen)
        time.sleep(0.2)
    query_box["query"].stop()
    stop_relay.set()
    relay_thread.join(timeout=60)
    return sorted(
        seen[event_id] - committed[event_id] for event_id in committed if event_id in seen
    )


def _look(settings: LakeSettings, seen: dict[str, float]) -> None:
    try:
        table = DeltaTable(settings.table_uri("events"))
    except Exception:  # not created yet
        return
    now = time.time()
    dataset = table.to_pyarrow_dataset()
    for event_id in dataset.to_table(columns=["event_id"]).column(0).to_pylist():
        seen.setdefault(event_id, now)


def main() -> None:
    parser = argparse.ArgumentParser(description="Lake ingest benchmark.")
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--small-rows", type=int, default=100_000)
    parser.add_argument("--big-rows", type=int, default=1_000_000)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--rates", default="1000,10000", help="events/s for the latency runs")
    parser.add_argument("--json", help="also write the figures to this JSON file")
    arguments = parser.parse_args()
    results = Results("lake_ingest", arguments.json)

    stack = postgres_and_broker()
    bootstrap = stack.bootstrap_servers
    work = Path(tempfile.mkdtemp(prefix="outbox-lake-bench-"))
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores; Spark local[2], Delta's "
        "Spark writer, "
        f"{'external Kafka' if stack.broker is None else stack.broker.describe()} on loopback"
    )
    results.figures["broker"] = "external" if stack.broker is None else stack.broker.describe()
    spark = spark_session(lake_settings())
    try:
        warm_type = f"warm{uuid.uuid4().hex[:8]}"  # JVM, Python workers: warm before timing
        produce(bootstrap, warm_type, 1000)
        warm = lake_settings(
            root=str(work / "warm"), topic_pattern=rf"^outbox\.event\.{warm_type}$"
        )
        ingest_rate(spark, warm, bootstrap, None, 1000)
        aggregate_type = f"ing{uuid.uuid4().hex[:8]}"
        produce(bootstrap, aggregate_type, arguments.events)
        pattern = rf"^outbox\.event\.{aggregate_type}$"
        dedup_settings = lake_settings(root=str(work / "dedup"), topic_pattern=pattern)
        append_settings = lake_settings(root=str(work / "append"), topic_pattern=pattern)
        appended, _ = ingest_rate(
            spark, append_settings, bootstrap, AppendSink(append_settings), arguments.events
        )
        deduped, driver_cpu = ingest_rate(spark, dedup_settings, bootstrap, None, arguments.events)
        print(f"ingest, plain append        : {appended:>9,.0f} events/s")
        print(f"ingest, with dedup          : {deduped:>9,.0f} events/s")
        print(f"dedup time / append time    : {appended / deduped:>9.2f}   target <= 1.5")
        print(f"driver CPU per 100,000 events: {driver_cpu:>8.2f} s (the Python driver)")
        results.figures.update(
            events=arguments.events,
            append_events_per_second=round(appended, 1),
            dedup_events_per_second=round(deduped, 1),
            dedup_over_append_time=round(appended / deduped, 3),
            driver_cpu_seconds_per_100k=round(driver_cpu, 3),
        )

        small = batch_time(spark, work / "small", arguments.small_rows)
        big = batch_time(spark, work / "big", arguments.big_rows)
        print(f"10,000-event batch, table of {arguments.small_rows:>9,} rows: {small:6.2f} s")
        print(f"10,000-event batch, table of {arguments.big_rows:>9,} rows: {big:6.2f} s")
        print(f"ratio                       : {big / small:>9.2f}   target <= 1.2")
        results.figures["batch_seconds_by_table_rows"] = {
            str(arguments.small_rows): round(small, 3),
            str(arguments.big_rows): round(big, 3),
        }

        database_root = stack.postgres
        for rate in [int(r) for r in arguments.rates.split(",") if r]:
            url = fresh_database(stack, DATABASE)
            waits = latency(
                spark,
                stack,
                url,
                database_root.conninfo(DATABASE),
                work / f"latency-{rate}",
                arguments.seconds,
                rate,
            )
            target = 2.0 if rate <= 1000 else 3.0
            print(
                f"commit-to-queryable at {rate:,} events/s over {arguments.seconds:.0f} s "
                f"({len(waits):,} events, trigger {LakeSettings().trigger_seconds} s): "
                f"p50 {percentile(waits, 0.5):.2f} s, p95 {percentile(waits, 0.95):.2f} s   "
                f"target p95 < {target:g} s"
            )
            results.figures[f"commit_to_queryable_seconds_at_{rate}"] = {
                "p50": round(percentile(waits, 0.5), 3),
                "p95": round(percentile(waits, 0.95), 3),
            }
            database_root.drop_database(DATABASE)
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)
    results.write()


if __name__ == "__main__":
    main()
