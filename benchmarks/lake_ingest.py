"""Lake ingest: dedup cost, table-size sensitivity, and commit-to-queryable latency.

Prints, from one run on the native stack (PostgreSQL and the local broker, started if
needed; Spark in local mode):

1. ingest events per second over ``--events`` (100,000) events already on Kafka, through the
   job with its dedup (insert-only merge per day partition) and with a plain append of the
   same records, and the ratio of their times (target: dedup <= 1.5x append);
2. the time of one batch of 10,000 new events written by the sink when ``events`` holds
   100,000 rows and when it holds 1,000,000 (spread over 30 days, the batches in today's
   partition; median of 5 batches), and their ratio (target <= 1.2);
3. commit-to-queryable latency p50/p95 at a steady 500 events/s for ``--seconds`` with the
   default trigger: from the SDK commit to the event being readable from the lake with
   ``deltalake`` (target p95 < 10 s). Events reach Kafka through the polling relay.

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
from outbox_lake.delta_sink import EVENTS_SCHEMA, DeltaSink, parsed_frame
from outbox_lake.job import run_ingest, spark_session
from outbox_lake.settings import LakeSettings
from outbox_relay.service import Relay
from outbox_relay.settings import RelaySettings
from outbox_stack.local import LocalStack

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


class AppendSink:
    """The baseline: the same parsed rows, appended with no dedup and no idempotence."""

    def __init__(self, settings: LakeSettings) -> None:
        self.settings = settings

    def __call__(self, frame: Any, batch_id: int) -> None:
        table = parsed_frame(frame).where("kind = 'event'").toArrow()  # one read, like the sink
        if not table.num_rows:
            return
        table = table.select(EVENTS_SCHEMA.names).cast(EVENTS_SCHEMA)
        write_deltalake(
            self.settings.table_uri("events"), table, mode="append", partition_by=["event_date"]
        )


def ingest_rate(
    spark: Any, settings: LakeSettings, bootstrap: str, sink: Any, events: int
) -> float:
    started = time.monotonic()
    run_ingest(settings, bootstrap, available_now=True, sink=sink, spark=spark)
    elapsed = time.monotonic() - started
    landed = DeltaTable(settings.table_uri("events")).to_pyarrow_dataset().count_rows()
    if landed != events:
        raise RuntimeError(f"{landed} rows landed of {events}")
    return events / elapsed


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


def batch_time(root: Path, existing: int, batches: int = 5) -> float:
    """Median seconds for the sink to write a batch of 10,000 new events into ``events``
    holding ``existing`` rows (``batches`` batches, one after the other)."""
    settings = LakeSettings(root=str(root))
    now = datetime.now(UTC)
    write_deltalake(
        settings.table_uri("events"),
        synthetic(existing, now - timedelta(days=30), 30),
        partition_by=["event_date"],
    )
    sink = DeltaSink(settings)
    times = []
    for batch_id in range(1, batches + 1):
        batch = synthetic(10_000, now, 0).append_column("kind", pa.array(["event"] * 10_000))
        started = time.monotonic()
        # the events table's merge, day partitions
        sink._write_events(batch, {("outbox.event.bench", 0): batch_id * 10_000})
        times.append(time.monotonic() - started)
    return sorted(times)[len(times) // 2]


def latency(
    spark: Any, stack: LocalStack, url: str, conninfo: str, root: Path, seconds: float
) -> list[float]:
    aggregate_type = f"lat{uuid.uuid4().hex[:8]}"
    settings = LakeSettings(root=str(root), topic_pattern=rf"^outbox\.event\.{aggregate_type}$")
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
        from outbox_lake.job import read_raw

        query_box["query"] = (
            read_raw(spark, settings, stack.bootstrap_servers)
            .writeStream.foreachBatch(DeltaSink(settings).write_spark_batch)
            .option("checkpointLocation", settings.checkpoint)
            .trigger(processingTime=f"{settings.trigger_seconds} seconds")
            .start()
        )

    ingest()
    commit_times: dict[uuid.UUID, float] = {}
    seen: dict[str, float] = {}
    paced_writes(  # 5 events every 10 ms: 500 events/s
        conninfo,
        aggregate_type,
        commit_times,
        events_per_tick=5,
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
    for event_id in table.to_pyarrow_dataset().to_table(columns=["event_id"]).column(0).to_pylist():
        seen.setdefault(event_id, now)


def main() -> None:
    parser = argparse.ArgumentParser(description="Lake ingest benchmark.")
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--small-rows", type=int, default=100_000)
    parser.add_argument("--big-rows", type=int, default=1_000_000)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--json", help="also write the figures to this JSON file")
    arguments = parser.parse_args()
    results = Results("lake_ingest", arguments.json)

    stack = postgres_and_broker()
    bootstrap = stack.bootstrap_servers
    work = Path(tempfile.mkdtemp(prefix="outbox-lake-bench-"))
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores; Spark local[2], deltalake, "
        f"{'external Kafka' if stack.broker is None else stack.broker.describe()} on loopback"
    )
    results.figures["broker"] = "external" if stack.broker is None else stack.broker.describe()
    spark = spark_session(LakeSettings())
    try:
        warm_type = f"warm{uuid.uuid4().hex[:8]}"  # JVM, Python workers: warm before timing
        produce(bootstrap, warm_type, 1000)
        warm = LakeSettings(root=str(work / "warm"), topic_pattern=rf"^outbox\.event\.{warm_type}$")
        ingest_rate(spark, warm, bootstrap, DeltaSink(warm).write_spark_batch, 1000)
        aggregate_type = f"ing{uuid.uuid4().hex[:8]}"
        produce(bootstrap, aggregate_type, arguments.events)
        pattern = rf"^outbox\.event\.{aggregate_type}$"
        dedup_settings = LakeSettings(root=str(work / "dedup"), topic_pattern=pattern)
        append_settings = LakeSettings(root=str(work / "append"), topic_pattern=pattern)
        appended = ingest_rate(
            spark, append_settings, bootstrap, AppendSink(append_settings), arguments.events
        )
        deduped = ingest_rate(
            spark,
            dedup_settings,
            bootstrap,
            DeltaSink(dedup_settings).write_spark_batch,
            arguments.events,
        )
        print(f"ingest, plain append        : {appended:>9,.0f} events/s")
        print(f"ingest, with dedup          : {deduped:>9,.0f} events/s")
        print(f"dedup time / append time    : {appended / deduped:>9.2f}   target <= 1.5")
        results.figures.update(
            events=arguments.events,
            append_events_per_second=round(appended, 1),
            dedup_events_per_second=round(deduped, 1),
            dedup_over_append_time=round(appended / deduped, 3),
        )

        small = batch_time(work / "small", arguments.small_rows)
        big = batch_time(work / "big", arguments.big_rows)
        print(f"10,000-event batch, table of {arguments.small_rows:>9,} rows: {small:6.2f} s")
        print(f"10,000-event batch, table of {arguments.big_rows:>9,} rows: {big:6.2f} s")
        print(f"ratio                       : {big / small:>9.2f}   target <= 1.2")
        results.figures["batch_seconds_by_table_rows"] = {
            str(arguments.small_rows): round(small, 3),
            str(arguments.big_rows): round(big, 3),
        }

        database_root = stack.postgres
        url = fresh_database(stack, DATABASE)
        waits = latency(
            spark, stack, url, database_root.conninfo(DATABASE), work / "latency", arguments.seconds
        )
        print(
            f"commit-to-queryable at 500 events/s over {arguments.seconds:.0f} s "
            f"({len(waits):,} events, trigger {LakeSettings().trigger_seconds} s): "
            f"p50 {percentile(waits, 0.5):.2f} s, p95 {percentile(waits, 0.95):.2f} s   "
            "target p95 < 10 s"
        )
        results.figures["commit_to_queryable_seconds_at_500"] = {
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
