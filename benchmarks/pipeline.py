"""The whole pipeline under sustained load: writers -> PostgreSQL -> CDC -> Kafka -> lake.

On the native stack (PostgreSQL, the stack's Apache Kafka or the cluster
``OUTBOX_KAFKA_BOOTSTRAP_SERVERS`` names, Kafka Connect in exactly-once source mode with
Debezium and the Outbox Event Router), with the lake job running continuously in its own
process (``outbox lake ingest``, Spark local mode, default trigger). For each rate (1,000,
2,000, 5,000, 10,000 events/s, then ``max``: writers as fast as they can) writers commit
events for ``--seconds``, then the run waits for the lake to hold them all. Printed per rate:

- whether the pipeline kept up: every event landed within the drain time, and the
  commit-to-queryable latency of the last fifth of the events is not much above the first
  fifth's (a pipeline that falls behind shows latency growing through the run);
- commit-to-queryable p50/p95/p99: from the transaction's commit time in PostgreSQL
  (``pg_xact_commit_timestamp``, ``track_commit_timestamp`` is on in the local stack) to the
  moment the Delta commit that added the event was written;
- events/s per stage: written (commits), on the broker (Connect's record timestamps, as a
  ``read_committed`` consumer reads them), in the lake (Delta commits), each over its own
  first-to-last span;
- CPU per process, in cores: PostgreSQL (all its processes), broker, Connect, the lake job
  (launcher, Spark driver JVM and its Python workers), the writers.

The knee is the first rate the pipeline does not keep up with.

    python -m benchmarks.pipeline                                # about 10 minutes
    python -m benchmarks.pipeline --rates 500 1000 --seconds 8   # smoke
"""

from __future__ import annotations

import argparse
import math
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg
import sqlalchemy as sa
from kafka import KafkaConsumer

import outbox_migrations
from benchmarks._probes import CpuMeter, DeltaLogFollower, own_cpu_seconds
from benchmarks._results import Results
from benchmarks._shared import (
    broker_name,
    connect_name,
    delete_topics,
    fresh_database,
    percentile,
    stack_names,
)
from benchmarks.cdc_throughput import CDC_ROLE, drop_slots, remove_leftovers
from outbox import Event, Outbox, OutboxSettings
from outbox.core.contract import event_id_of, topic_for
from outbox_connect import ConnectClient, ConnectorSettings, render_connector_config
from outbox_lake.settings import LakeSettings
from outbox_stack.local import LocalStack

DATABASE = "outbox_bench_pipeline"
# The connector's name: this, then a run id. Connect keeps a deleted connector's source
# offsets, and Debezium refuses to start from an offset a new slot cannot serve: each run's
# connector has a name of its own.
CONNECTOR = "benchpipeline"
TICK_SECONDS = 0.020
WRITERS = 2
MAX_BATCH = 100  # events per transaction when writing as fast as possible


def write(
    conninfo: str, aggregate_type: str, per_tick: int, seconds: float, start_at: float, out: Any
) -> None:
    """One writer: ``per_tick`` events in one transaction every tick (0: back to back, 100
    per transaction) for ``seconds``, over 50 aggregates. Sends (events, CPU seconds)."""
    outbox = Outbox()
    written = 0
    with psycopg.connect(conninfo) as connection:
        while time.time() < start_at:
            time.sleep(0.001)
        cpu = own_cpu_seconds()
        tick = time.monotonic()
        end = tick + seconds
        while tick < end:
            count = per_tick or MAX_BATCH
            events = [
                Event(aggregate_type, str((written + i) % 50), "Tick", {"n": written + i})
                for i in range(count)
            ]
            with connection.transaction():
                outbox.publish_many(connection, events)
            written += count
            if per_tick:
                tick += TICK_SECONDS
                time.sleep(max(0.0, tick - time.monotonic()))  # the pace, not a condition
            else:
                tick = time.monotonic()
    out.put((written, own_cpu_seconds() - cpu))


EVENTS_PER_WRITER = 2_500
"""Events per second one writer process is asked for at most."""

WARM_UP_SECONDS = 20.0
"""Seconds of writes at 1,000 events/s before the first measured rate (not reported)."""


def writers_for(rate: int | None) -> tuple[int, int]:
    """(writers, events per tick each) for ``rate`` events/s; None: as fast as they can.

    At least two writers, 50 transactions a second each: a commit waits for a flush, which
    on a shared machine can take several milliseconds, so one writer alone could not keep a
    pace of 100 commits a second; and one more writer per 2,500 events/s (building and
    sending a tick's events takes a writer's whole tick near 5,000/s: two writers offered
    only 7,085 events/s when 10,000 were asked)."""
    if rate is None:
        return WRITERS, 0
    count = max(WRITERS, math.ceil(rate / EVENTS_PER_WRITER))
    return count, max(1, round(rate * TICK_SECONDS / count))


def run_writers(
    conninfo: str, aggregate_type: str, rate: int | None, seconds: float
) -> tuple[int, float]:
    count, per_tick = writers_for(rate)
    out: multiprocessing.Queue = multiprocessing.Queue()  # type: ignore[type-arg]
    start_at = time.time() + 1.0
    processes = [
        multiprocessing.Process(
            target=write, args=(conninfo, aggregate_type, per_tick, seconds, start_at, out)
        )
        for _ in range(count)
    ]
    for process in processes:
        process.start()
    reports = [out.get(timeout=seconds + 120) for _ in processes]
    for process in processes:
        process.join(timeout=30)
    return sum(r[0] for r in reports), sum(r[1] for r in reports)


def commit_times(conninfo: str, first: int, last: int) -> dict[str, float]:
    """Event id -> commit time (epoch seconds) of the rows with positions in [first, last]."""
    with psycopg.connect(conninfo) as connection:
        rows = connection.execute(
            "SELECT id::text, extract(epoch FROM pg_xact_commit_timestamp(xmin))::float8 "
            "FROM outbox.outbox WHERE position BETWEEN %s AND %s",
            (first, last),
        ).fetchall()
    return dict(rows)


def last_position(conninfo: str) -> int:
    with psycopg.connect(conninfo) as connection:
        row = connection.execute("SELECT coalesce(max(position), 0) FROM outbox.outbox").fetchone()
    assert row is not None
    return int(row[0])


def broker_times(consumer: KafkaConsumer, wanted: set[str], timeout: float) -> dict[str, float]:
    """Event id -> the record's timestamp (set by Connect when it produced the record)."""
    found: dict[str, float] = {}
    deadline = time.monotonic() + timeout
    while len(found) < len(wanted) and time.monotonic() < deadline:
        for records in consumer.poll(timeout_ms=500, max_records=20_000).values():
            for record in records:
                event_id = str(event_id_of(record.headers))
                if event_id in wanted:
                    found[event_id] = record.timestamp / 1000
    return found


def rate_per_second(moments: list[float]) -> float:
    span = max(moments) - min(moments) if moments else 0.0
    return len(moments) / span if span > 0 else 0.0


def summarise(
    rate: int | None,
    written: int,
    seconds: float,
    committed: dict[str, float],
    on_broker: dict[str, float],
    queryable: dict[str, float],
) -> dict[str, Any]:
    in_order = sorted(committed, key=committed.__getitem__)
    landed = [event_id for event_id in in_order if event_id in queryable]
    waits = sorted(queryable[e] - committed[e] for e in landed)
    fifth = max(1, len(landed) // 5)
    early = sorted(queryable[e] - committed[e] for e in landed[:fifth])
    late = sorted(queryable[e] - committed[e] for e in landed[-fifth:])
    early_p50 = percentile(early, 0.5) if early else 0.0
    late_p50 = percentile(late, 0.5) if late else 0.0
    keeps_up = len(landed) == len(committed) and late_p50 <= 1.5 * early_p50 + 1.0
    broker_waits = sorted(on_broker[e] - committed[e] for e in in_order if e in on_broker)
    broker_rate = rate_per_second(list(on_broker.values()))
    lake_rate = rate_per_second([queryable[e] for e in landed])
    return {
        "rate": "max" if rate is None else rate,
        "seconds": seconds,
        "written": written,
        "landed": len(landed),
        "keeps_up": keeps_up,
        "events_per_second": {
            "written": round(rate_per_second(list(committed.values())), 1),
            "broker": round(broker_rate, 1),
            "lake": round(lake_rate, 1),
        },
        "commit_to_queryable_seconds": {
            name: round(percentile(waits, fraction), 3) if waits else None
            for name, fraction in (("p50", 0.5), ("p95", 0.95), ("p99", 0.99))
        },
        "commit_to_broker_seconds": {
            name: round(percentile(broker_waits, fraction), 3) if broker_waits else None
            for name, fraction in (("p50", 0.5), ("p95", 0.95), ("p99", 0.99))
        },
        # The lake against CDC in the same run (issue 15's target: >= 1.0 at "max").
        "lake_over_broker": round(lake_rate / broker_rate, 3) if broker_rate else None,
        "first_fifth_p50_seconds": round(early_p50, 3),
        "last_fifth_p50_seconds": round(late_p50, 3),
    }


def start_connector(stack: LocalStack) -> ConnectorSettings:
    client = ConnectClient(stack.connect.rest_url)
    name = f"{CONNECTOR}{uuid.uuid4().hex[:6]}"
    settings = ConnectorSettings(
        url=stack.connect.rest_url,
        name=name,
        database_port=stack.postgres.port,
        database_name=DATABASE,
        database_user=CDC_ROLE,
        slot_name=f"slot_{name}",
        topic_prefix=name,
    )
    client.apply(name, render_connector_config(settings, OutboxSettings()))
    client.wait_running(name, timeout=120)
    return settings


def start_lake(stack: LocalStack, root: Path, aggregate_type: str, log: Path) -> subprocess.Popen:  # type: ignore[type-arg]
    environment = {
        **os.environ,
        "OUTBOX_LAKE_ROOT": str(root),
        "OUTBOX_LAKE_TOPIC_PATTERN": rf"^outbox\.event\.{aggregate_type}$",
        "OUTBOX_KAFKA_BOOTSTRAP_SERVERS": stack.bootstrap_servers,
    }
    with log.open("wb") as output:
        return subprocess.Popen(
            [sys.executable, "-m", "outbox_cli.main", "lake", "ingest"],
            env=environment,
            stdout=output,
            stderr=subprocess.STDOUT,
        )


def wait_landed(
    follower: DeltaLogFollower,
    wanted: set[str],
    timeout: float,
    lake: subprocess.Popen,  # type: ignore[type-arg]
) -> float:
    """Follow the lake until it holds ``wanted``; the seconds waited."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        follower.poll()
        if wanted.issubset(follower.queryable_at.keys()):
            break
        if lake.poll() is not None:
            raise RuntimeError(f"the lake job stopped (exit {lake.returncode})")
        time.sleep(0.5)  # polling a folder: there is no event to await
    return time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(description="The whole pipeline under sustained load.")
    parser.add_argument(
        "--rates",
        nargs="+",
        default=["1000", "2000", "5000", "10000", "max"],
        help="events/s per run; 'max': writers as fast as they can",
    )
    parser.add_argument("--seconds", type=float, default=30.0, help="writing time per rate")
    parser.add_argument("--drain-seconds", type=float, default=120.0, help="wait for the lake")
    parser.add_argument("--json", help="also write the figures to this JSON file")
    parser.add_argument(
        "--lake-log", help="keep the lake job's log (each batch's time per stage) in this file"
    )
    arguments = parser.parse_args()
    rates = [None if rate == "max" else int(rate) for rate in arguments.rates]
    results = Results("pipeline", arguments.json)

    stack = LocalStack()
    stack.up()
    # A connector left over by an interrupted run holds a slot on the database.
    remove_leftovers(stack.connect.rest_url, stack.postgres.conninfo("postgres"), (CONNECTOR,))
    url = fresh_database(stack, DATABASE)
    engine = sa.create_engine(url)
    with engine.begin() as connection:
        outbox_migrations.create_cdc_role(connection, CDC_ROLE, stack.cdc_password())
    engine.dispose()
    conninfo = stack.postgres.conninfo(DATABASE)
    connector = start_connector(stack)
    aggregate_type = f"pipe{uuid.uuid4().hex[:8]}"
    work = Path(tempfile.mkdtemp(prefix="outbox-pipeline-bench-"))
    lake = start_lake(stack, work / "lake", aggregate_type, work / "lake.log")
    follower = DeltaLogFollower(Path(LakeSettings(root=str(work / "lake")).table_uri("events")))
    consumer = KafkaConsumer(
        topic_for(aggregate_type),
        bootstrap_servers=stack.bootstrap_servers,
        isolation_level="read_committed",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        fetch_max_bytes=64 * 2**20,
    )
    pids = {
        "postgres": stack.postgres.status().pid,
        "broker": stack.broker.process.pid() if stack.broker is not None else None,
        "connect": stack.connect.process.pid(),
        "lake job": lake.pid,
    }
    meter = CpuMeter({name: pid for name, pid in pids.items() if pid is not None})
    print(
        f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}; PostgreSQL 15, "
        f"{connect_name()} + Event Router (exactly-once source), {broker_name(stack)}, lake "
        f"job in Spark local[2] (trigger {LakeSettings().trigger_seconds:g} s); "
        f"{arguments.seconds:g} s per rate"
    )
    results.data["stack"] = stack_names(stack, connect=True)
    results.figures["broker"] = broker_name(stack)
    runs: list[dict[str, Any]] = []
    try:
        # Warm up: Connect creates the topic, the lake job finds it and lands its first
        # batches (they compile the contract's generated code and warm the JVM: without
        # this the first measured rate's p95 is the job's start, 5.1 s against 2 s warm).
        start = last_position(conninfo) + 1
        run_writers(conninfo, aggregate_type, 1000, WARM_UP_SECONDS)
        warm = set(commit_times(conninfo, start, last_position(conninfo)))
        wait_landed(follower, warm, 300, lake)
        header = (
            f"{'rate/s':>7} {'keeps up':>8} {'written/s':>9} {'broker/s':>9} {'lake/s':>9} "
            f"{'lake/CDC':>8} {'p50 s':>6} {'p95 s':>6} {'p99 s':>6}  cpu (cores)"
        )
        print(header)
        for rate in rates:
            start = last_position(conninfo) + 1
            meter.start()
            written, writer_cpu = run_writers(conninfo, aggregate_type, rate, arguments.seconds)
            cpu = meter.stop()
            cpu["writers"] = round(writer_cpu / arguments.seconds, 2)
            committed = commit_times(conninfo, start, last_position(conninfo))
            drained = wait_landed(follower, set(committed), arguments.drain_seconds, lake)
            on_broker = broker_times(consumer, set(committed), 60)
            run = summarise(
                rate, written, arguments.seconds, committed, on_broker, follower.queryable_at
            )
            run["drain_seconds"] = round(drained, 1)
            run["cpu_cores"] = cpu
            run["load_average"] = round(os.getloadavg()[0], 2)
            runs.append(run)
            speed, waits = run["events_per_second"], run["commit_to_queryable_seconds"]
            print(
                f"{run['rate']:>7} {'yes' if run['keeps_up'] else 'NO':>8} "
                f"{speed['written']:>9,.0f} {speed['broker']:>9,.0f} {speed['lake']:>9,.0f} "
                f"{run['lake_over_broker'] or 0:>8.2f} {waits['p50'] or 0:>6.2f} "
                f"{waits['p95'] or 0:>6.2f} {waits['p99'] or 0:>6.2f}  "
                + ", ".join(f"{name} {value:.2f}" for name, value in cpu.items())
            )
            if run["landed"] < len(committed):
                print(
                    f"  the lake held {run['landed']:,} of {len(committed):,} events after "
                    f"{drained:.0f} s: stopping the sweep here"
                )
                break
        knee = next((run["rate"] for run in runs if not run["keeps_up"]), None)
        print(
            f"knee: {knee if knee is not None else 'not reached'} "
            "(targets: 10,000/s kept up; p95 < 2 s at 1,000/s, < 3 s at 5,000/s)"
        )
        for run in runs:
            if run["rate"] == "max":
                ratio = run["lake_over_broker"] or 0.0
                verdict = "met" if ratio >= 1.0 else "MISSED"
                print(f"lake / CDC, writers at full speed: {ratio:.2f}, target >= 1.0: {verdict}")
        results.figures.update(runs=runs, knee=knee, trigger_seconds=LakeSettings().trigger_seconds)
    except Exception:
        log = (work / "lake.log").read_text(errors="replace").splitlines()
        print("the lake job's log ends with:\n" + "\n".join(log[-40:]))
        raise
    finally:
        consumer.close()
        lake.send_signal(signal.SIGTERM)
        try:
            lake.wait(timeout=120)
        except subprocess.TimeoutExpired:
            lake.kill()
            lake.wait(timeout=30)
        if arguments.lake_log:
            shutil.copyfile(work / "lake.log", arguments.lake_log)
        ConnectClient(connector.url).delete(connector.name)
        # after the connector, which would otherwise create it again
        delete_topics(stack.bootstrap_servers, [topic_for(aggregate_type)])
        drop_slots(stack.postgres.conninfo("postgres"), [connector.slot_name])
        stack.postgres.drop_database(DATABASE)
        shutil.rmtree(work, ignore_errors=True)
    results.write()


if __name__ == "__main__":
    main()
