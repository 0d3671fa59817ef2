"""The lake beside Spark's own Delta sink, in one run: freshness, catch-up, cold start.

The floor is what Spark and Delta reach by themselves on the same records: Spark's own
``format("delta")`` streaming sink, append only, the JSON parsed by ``from_json``, no dedup,
with the same session settings as our job (``outbox_lake.session.TUNED``), statistics on.
Each run here puts the floor and our job side by side, interleaved, on the same machine,
and prints our figures as ratios to the floor's:

1. **freshness** at each ``--rates`` (1,000 and 10,000 events/s): producer processes offer
   the rate for ``--seconds`` (120) on a fresh 2-partition topic, the job runs continuously
   (1 s trigger); commit-to-queryable per event is the time from its produce (its UUIDv7
   time) to the Delta commit file that holds it (the file's mtime), the first third left
   out as warm-up (reported apart). Also the median micro-batch, events landed per second,
   and, for our job, the typed table's freshness (it trails ``events`` by design);
2. **catch-up**: ``--backlog`` events (1,000,000) already on Kafka, ingested with
   ``availableNow``: events per second of each until ``events`` holds them all (the typed
   tables are filled after ``events``; ours is also given until they hold them too);
3. **cold start**: ``outbox lake ingest --available-now`` as a command on 1,000 events: its
   wall time and its first batch's, from a new JVM.

    python -m benchmarks.lake_ingest                     # about 15 minutes
    python -m benchmarks.lake_ingest --rates 1000 --seconds 60 --backlog 50000
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import multiprocessing
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import uuid
from pathlib import Path
from typing import Any

from benchmarks._results import Results
from benchmarks._shared import delete_topics, percentile, postgres_and_broker
from outbox_lake.settings import LakeSettings
from outbox_stack.artifacts import spark_extra_jars
from outbox_stack.settings import StackSettings

PARTITIONS = 2


def lake_settings(**values: Any) -> LakeSettings:
    """Settings with the project's Spark jars (Kafka source, Delta writer)."""
    jars = ",".join(map(str, spark_extra_jars(StackSettings().downloads_root)))
    return LakeSettings(spark_jars=jars, **values)


def produce(bootstrap: str, topic: str, rate: float, seconds: float, events: int) -> None:
    """Outbox-shaped records at ``rate`` per second for ``seconds`` (or ``events`` at full
    speed when ``rate`` is 0); ids drawn at send time (their UUIDv7 time is the send time)."""
    from kafka import KafkaProducer

    from outbox import new_event_id
    from outbox.core.contract import record_for

    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=5, batch_size=262_144)
    aggregate_type = topic.removeprefix("outbox.event.")
    started = time.monotonic()
    sent = 0
    while True:
        if rate:
            elapsed = time.monotonic() - started
            if elapsed >= seconds:
                break
            due = int(elapsed * rate)
        else:
            if sent >= events:
                break
            due = min(events, sent + 1000)
        while sent < due:
            record = record_for(
                event_id=new_event_id(),
                aggregate_type=aggregate_type,
                aggregate_id=str(sent % 500),
                event_type="Tick",
                payload_text=(
                    f'{{"n": {sent}, "name": "item-{sent % 97}", "price": {sent % 1000}.5}}'
                ),
                headers_text="{}",
                traceparent="",
                position=sent + 1,
            )
            producer.send(
                record.topic, key=record.key, value=record.value, headers=list(record.headers)
            )
            sent += 1
        if rate:
            time.sleep(0.002)
    producer.flush()
    producer.close()


def offer(bootstrap: str, topic: str, rate: float, seconds: float, events: int = 0) -> None:
    """:func:`produce` from as many processes as the rate needs (5,000 events/s each)."""
    processes = max(1, math.ceil((rate or 20_000) / 5_000))
    workers = [
        multiprocessing.Process(
            target=produce,
            args=(bootstrap, topic, rate / processes, seconds, math.ceil(events / processes)),
        )
        for _ in range(processes)
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()


_CREATED: list[str] = []
"""The topics this run made (deleted at its end: they match every lake's default pattern)."""


def new_topic(bootstrap: str, prefix: str) -> str:
    from kafka.admin import KafkaAdminClient, NewTopic

    topic = f"outbox.event.{prefix}{uuid.uuid4().hex[:8]}"
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.create_topics([NewTopic(topic, PARTITIONS, 1)])
        _CREATED.append(topic)
    finally:
        admin.close()
    return topic


def delete_created(bootstrap: str) -> None:
    """Delete the topics this run made (:func:`benchmarks._shared.delete_topics`)."""
    delete_topics(bootstrap, list(_CREATED))
    _CREATED.clear()


def commit_waits(table: Path) -> list[tuple[float, float]]:
    """(produce time, seconds to the commit that holds it) of every row of a Delta table,
    from its log: each commit file's mtime and its added files' event ids."""
    import pyarrow.parquet as pq

    found = []
    for commit in sorted(glob.glob(str(table / "_delta_log" / "*.json"))):
        committed = os.path.getmtime(commit)
        for line in Path(commit).read_text().splitlines():
            added = json.loads(line).get("add")
            if not added:
                continue
            path = table / urllib.parse.unquote(added["path"])
            for event_id in pq.read_table(path, columns=["event_id"]).column(0).to_pylist():
                produced = int(event_id[:8] + event_id[9:13], 16) / 1000
                found.append((produced, committed - produced))
    return sorted(found)


def summary(waits: list[tuple[float, float]], batches: list[float]) -> dict[str, Any]:
    """Warm-up (first third of the produce time) apart from the steady state."""
    if not waits:
        return {"events": 0}
    first, last = waits[0][0], waits[-1][0]
    cut = first + (last - first) / 3
    steady = sorted(wait for produced, wait in waits if produced >= cut)
    warm = sorted(wait for produced, wait in waits if produced < cut)
    return {
        "events": len(waits),
        "p50": round(percentile(steady, 0.5), 3),
        "p95": round(percentile(steady, 0.95), 3),
        "warmup_p95": round(percentile(warm, 0.95), 3) if warm else None,
        "median_batch_seconds": round(sorted(batches)[len(batches) // 2], 3) if batches else None,
    }


def run_floor(spark: Any, settings: LakeSettings, bootstrap: str, available_now: bool) -> Any:
    """Spark's own Delta sink: the records' JSON by ``from_json``, appended as they come."""
    from pyspark.sql import functions as f

    source = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("kafka.isolation.level", "read_committed")
        .option("subscribePattern", settings.topic_pattern)
        .option("startingOffsets", "earliest")
        .option("includeHeaders", "true")
        .option("maxOffsetsPerTrigger", str(settings.max_records_per_batch))
        .load()
    )
    rows = source.select(
        f.expr("CAST(get(headers, 0).value AS string)").alias("event_id"),
        f.col("key").cast("string").alias("aggregate_id"),
        f.from_json(f.col("value").cast("string"), "n long, name string, price double").alias("p"),
        "topic",
        "partition",
        "offset",
        "timestamp",
    ).select("event_id", "aggregate_id", "p.*", "topic", "partition", "offset", "timestamp")
    writer = (
        rows.writeStream.format("delta")
        .outputMode("append")
        .option("checkpointLocation", settings.checkpoint)
    )
    writer = (
        writer.trigger(availableNow=True)
        if available_now
        else writer.trigger(processingTime=f"{settings.trigger_seconds} seconds")
    )
    return writer.start(settings.table_uri("events"))


def freshness(
    spark: Any, bootstrap: str, work: Path, which: str, rate: int, seconds: float
) -> dict[str, Any]:
    """One continuous run of ``which`` (floor or ours) at ``rate`` for ``seconds``."""
    from outbox_lake.ingest import Ingest
    from outbox_lake.metrics import LakeMetrics

    topic = new_topic(bootstrap, f"fr{which}")
    root = work / f"{which}-{rate}-{uuid.uuid4().hex[:6]}"
    settings = lake_settings(root=str(root), topic_pattern="^" + topic.replace(".", r"\.") + "$")
    stop = threading.Event()
    metrics = LakeMetrics()
    job = None
    if which == "floor":
        query = run_floor(spark, settings, bootstrap, available_now=False)
    else:
        from outbox.settings import KafkaSettings

        ingest = Ingest(spark, settings, KafkaSettings(bootstrap_servers=bootstrap), metrics)
        job = threading.Thread(target=ingest.run, args=(stop,))
        job.start()
    time.sleep(3)  # the query started (its first trigger finds nothing)
    started = time.monotonic()
    offer(bootstrap, topic, rate, seconds)
    produced_for = time.monotonic() - started
    expected = int(rate * seconds * 0.99)
    deadline = time.monotonic() + 180
    events = root / "events"
    landed = 0
    while time.monotonic() < deadline:
        landed = _rows(events)
        if landed >= expected and time.monotonic() - started > seconds + 3:
            break
        time.sleep(1)
    drained = time.monotonic() - started
    typed = root / f"aggregate_{topic.removeprefix('outbox.event.')}"
    if which == "floor":
        batches = [p["batchDuration"] / 1000 for p in query.recentProgress if p["numInputRows"]]
        query.stop()
    else:
        while time.monotonic() < deadline and _rows(typed) < landed:
            time.sleep(1)
        batches = list(metrics.batch_durations)
        stop.set()
        assert job is not None
        job.join(timeout=180)
    result = summary(commit_waits(events), batches)
    result["events_per_second"] = round(landed / max(drained, produced_for), 1)
    result["offered_per_second"] = round(landed / produced_for, 1)
    if which == "ours" and typed.exists():
        result["typed"] = summary(commit_waits(typed), [])
    return result


def _rows(table: Path) -> int:
    if not (table / "_delta_log").exists():
        return 0
    from deltalake import DeltaTable

    try:
        return int(DeltaTable(str(table)).to_pyarrow_dataset().count_rows())
    except Exception:  # mid-commit: try again next time
        return 0


def catch_up(spark: Any, bootstrap: str, work: Path, backlog: int) -> dict[str, float]:
    """Events per second of each over the same backlog, already on Kafka: until ``events``
    holds it all (ours: also until the typed tables do, which the job fills after)."""
    from outbox.settings import KafkaSettings
    from outbox_lake.ingest import Ingest

    topic = new_topic(bootstrap, "cu")
    offer(bootstrap, topic, 0, 0, backlog)
    rates = {}
    for which in ("floor", "ours"):
        root = work / f"catch-up-{which}"
        settings = lake_settings(
            root=str(root), topic_pattern="^" + topic.replace(".", r"\.") + "$"
        )
        landed_at: list[float] = []
        done = threading.Event()
        watcher = threading.Thread(
            target=_watch, args=(root / "events", backlog, done, landed_at), daemon=True
        )
        started = time.monotonic()
        watcher.start()
        if which == "floor":
            run_floor(spark, settings, bootstrap, available_now=True).awaitTermination()
        else:
            ingest = Ingest(spark, settings, KafkaSettings(bootstrap_servers=bootstrap))
            ingest.run(threading.Event(), available_now=True)
        took = time.monotonic() - started
        done.set()
        watcher.join()
        landed = _rows(root / "events")
        if landed < backlog:
            raise RuntimeError(f"{which}: {landed} of {backlog} events landed")
        events_took = (landed_at[0] if landed_at else time.monotonic()) - started
        rates[which] = round(backlog / min(events_took, took), 1)
        if which == "ours":
            rates["ours_with_typed"] = round(backlog / took, 1)
    return rates


def _watch(events: Path, backlog: int, done: threading.Event, landed_at: list[float]) -> None:
    """Note when ``events`` first holds ``backlog`` rows (checked every 0.5 s)."""
    while not done.wait(0.5):
        if _rows(events) >= backlog:
            landed_at.append(time.monotonic())
            return


def cold_start(bootstrap: str, work: Path) -> dict[str, float]:
    """``outbox lake ingest --available-now`` on 1,000 events, as a command: wall seconds,
    and seconds until its first batch had landed."""
    topic = new_topic(bootstrap, "cold")
    offer(bootstrap, topic, 0, 0, 1000)
    env = {
        **os.environ,
        "OUTBOX_LAKE_ROOT": str(work / "cold"),
        "OUTBOX_LAKE_TOPIC_PATTERN": "^" + topic.replace(".", r"\.") + "$",
        "OUTBOX_KAFKA_BOOTSTRAP_SERVERS": bootstrap,
        "OUTBOX_LAKE_SPARK_JARS": lake_settings().spark_jars,
    }
    started = time.monotonic()
    started_at = time.time()
    done = subprocess.run(
        [sys.executable, "-m", "outbox_cli.main", "lake", "ingest", "--available-now"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    wall = time.monotonic() - started
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-2000:])
    # version 0 is the empty table the job creates; version 1 its first batch
    first = work / "cold/events/_delta_log/00000000000000000001.json"
    return {
        "wall_seconds": round(wall, 1),
        "first_batch_seconds": round(os.path.getmtime(first) - started_at, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description="The lake beside Spark's own Delta sink.")
    parser.add_argument("--rates", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--rounds", type=int, default=1, help="floor and ours, interleaved")
    parser.add_argument("--backlog", type=int, default=1_000_000)
    parser.add_argument("--json", help="also write the figures to this JSON file")
    arguments = parser.parse_args()
    results = Results("lake_ingest", arguments.json)

    from outbox_lake.session import TUNED

    stack = postgres_and_broker()
    bootstrap = stack.bootstrap_servers
    work = Path(tempfile.mkdtemp(prefix="outbox-lake-bench-"))
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores; Spark local[2] with "
        f"{', '.join(f'{k}={v}' for k, v in TUNED.items())}; "
        f"{'external Kafka' if stack.broker is None else stack.broker.describe()}",
        flush=True,
    )
    results.figures["broker"] = "external" if stack.broker is None else stack.broker.describe()
    try:
        _measure(arguments, results, bootstrap, work)
    finally:
        delete_created(bootstrap)
    shutil.rmtree(work, ignore_errors=True)
    results.write()


def _measure(arguments: argparse.Namespace, results: Results, bootstrap: str, work: Path) -> None:
    """Freshness at each rate, catch-up and cold start, each beside the floor."""
    from outbox_lake.session import spark_session

    spark = spark_session(lake_settings())
    try:
        fresh: dict[str, dict[str, list[dict[str, Any]]]] = {}
        for rate in arguments.rates:
            for _round in range(arguments.rounds):
                for which in ("floor", "ours"):
                    figures = freshness(spark, bootstrap, work, which, rate, arguments.seconds)
                    fresh.setdefault(str(rate), {}).setdefault(which, []).append(figures)
                    print(f"freshness at {rate:,}/s, {which}: {figures}", flush=True)
        results.figures["freshness"] = fresh
        print("\ncommit-to-queryable, steady state (first third apart), ours against the floor:")
        for rate, runs in fresh.items():
            floor, ours = _median(runs["floor"]), _median(runs["ours"])
            print(
                f"  {int(rate):>6,}/s  floor p50 {floor['p50']:.2f} p95 {floor['p95']:.2f} s, "
                f"{floor['events_per_second']:,.0f}/s | ours p50 {ours['p50']:.2f} "
                f"p95 {ours['p95']:.2f} s, {ours['events_per_second']:,.0f}/s | p95 ratio "
                f"{ours['p95'] / floor['p95']:.2f} (target <= 1.3), typed p95 "
                f"{ours.get('typed', {}).get('p95', float('nan')):.2f} s"
            )
        rates = catch_up(spark, bootstrap, work, arguments.backlog)
        ratio = rates["ours"] / rates["floor"]
        print(
            f"\ncatch-up of {arguments.backlog:,} events: floor {rates['floor']:,.0f}/s, ours "
            f"{rates['ours']:,.0f}/s into events, ratio {ratio:.2f} (target >= 0.8); ours "
            f"with the typed tables filled after: {rates['ours_with_typed']:,.0f}/s"
        )
        results.figures["catch_up"] = {
            "backlog": arguments.backlog,
            **rates,
            "ratio": round(ratio, 3),
        }
    finally:
        spark.stop()
    cold = cold_start(bootstrap, work)
    print(f"\ncold start, `outbox lake ingest --available-now` on 1,000 events: {cold}")
    results.figures["cold_start"] = cold


def _median(runs: list[dict[str, Any]]) -> dict[str, Any]:
    return sorted(runs, key=lambda run: run.get("p95", 0))[len(runs) // 2]


if __name__ == "__main__":
    main()
