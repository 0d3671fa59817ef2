"""Peak memory of ``outbox reconcile`` at two sizes (by default 100,000 and 1,000,000 events).

Starts a private PostgreSQL and Apache Kafka broker (one KRaft node) of its own (free
loopback ports, under ``<OUTBOX_STACK_DIR>/bench-reconcile``, default
``.stack/bench-reconcile``; the broker's topics are deleted at the end), produces contract
records with kafka-python (4 aggregate types, 2 partitions each, 1,000 aggregates per type),
writes the matching lake (``events`` and the typed tables, with the sink's per-partition
progress) directly with ``deltalake`` (Spark would take an hour on this machine for a
million events: the lake's contents, not how they got there, is what reconcile reads), then
runs ``outbox reconcile --json`` as a separate process under ``/usr/bin/time -v`` and prints
its peak RSS, its time and its figures.

    python -m benchmarks.reconcile_memory [--first 100000] [--events 1000000] [--cache-mb 8]

Measured: 469 MiB at 1,000,000 events, 480 MiB at 3,000,000 (``--first 1000000 --events
3000000``; docs/verifying-delivery.md).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import sqlalchemy as sa
from deltalake import CommitProperties, write_deltalake
from kafka import KafkaProducer
from kafka.admin import KafkaAdminClient, NewTopic

import outbox_migrations
from benchmarks._shared import free_port
from outbox.core.contract import headers_for, topic_for
from outbox_lake.names import typed_table_name
from outbox_lake.offsets import Partition, Progress
from outbox_lake.progress import LakeProgress
from outbox_lake.tables import EVENTS, EVENTS_TABLE
from outbox_lake.typed_rows import TYPED_BASE
from outbox_stack import PostgresCluster, StackSettings
from outbox_stack.broker import KafkaBroker

EVENTS_SCHEMA = EVENTS_TABLE.arrow_schema()
ROOT = Path(__file__).resolve().parents[1]
TYPES = 4
PARTITIONS = 2
AGGREGATES = 1000
CHUNK = 100_000


def uuid7(ms: int, n: int) -> uuid.UUID:
    return uuid.UUID(int=(ms << 80) | (0x7 << 76) | (0b10 << 62) | (n & ((1 << 62) - 1)))


def produce_and_land(bootstrap: str, lake: Path, prefix: str, start: int, count: int) -> None:
    """Events ``start`` to ``start + count`` on Kafka, and the same events in the lake."""
    producer = KafkaProducer(
        bootstrap_servers=bootstrap, linger_ms=20, batch_size=512 * 1024, enable_idempotence=True
    )
    base_ms = int(time.time() * 1000) - 60_000
    placed: dict[int, tuple[int, int]] = {}
    ends: dict[tuple[str, int], int] = {}
    events: list[dict[str, object]] = []

    def flush_lake(final: bool) -> None:
        if not events:
            return
        for index, row in enumerate(events):
            partition, offset = placed.pop(start_of_chunk + index)
            row["partition"], row["offset"] = partition, offset
            key = (str(row["topic"]), partition)
            ends[key] = max(ends.get(key, 0), offset + 1)
        table = pa.Table.from_pylist(events, schema=EVENTS_SCHEMA)
        progress = LakeProgress({Partition(t, p): Progress(e) for (t, p), e in ends.items()})
        commit = (
            CommitProperties(custom_metadata={"userMetadata": progress.to_metadata()})
            if final
            else None
        )
        write_deltalake(
            str(lake / EVENTS),
            table,
            mode="append",
            partition_by=["event_date"],
            commit_properties=commit,
        )
        by_type: dict[str, list[dict[str, object]]] = {}
        for row in events:
            by_type.setdefault(str(row["aggregate_type"]), []).append(
                {name: row[name] for name, _ in TYPED_BASE} | {"n": row["position"]}
            )
        schema = pa.schema([*TYPED_BASE, ("n", pa.int64())])
        for kind, rows in by_type.items():
            write_deltalake(
                str(lake / typed_table_name(kind)),
                pa.Table.from_pylist(rows, schema=schema),
                mode="append",
                partition_by=["event_date"],
            )
        events.clear()

    start_of_chunk = start
    for number in range(start, start + count):
        kind = f"{prefix}t{number % TYPES}"
        aggregate = str((number // TYPES) % AGGREGATES)
        event_id = uuid7(base_ms + number // 1000, number)
        headers = headers_for(
            event_id=str(event_id).encode(),
            event_type=b"Tick",
            traceparent=b"",
            headers=b"{}",
            position=str(number + 1).encode(),
        )
        future = producer.send(
            topic_for(kind), key=aggregate.encode(), value=b'{"n": %d}' % number, headers=headers
        )
        future.add_callback(
            lambda meta, n=number: placed.__setitem__(n, (meta.partition, meta.offset))
        )
        moment = datetime.fromtimestamp((event_id.int >> 80) / 1000, UTC)
        events.append(
            {
                "event_id": str(event_id),
                "aggregate_type": kind,
                "aggregate_id": aggregate,
                "event_type": "Tick",
                "payload": f'{{"n": {number}}}',
                "headers": "{}",
                "traceparent": None,
                "position": number + 1,
                "event_time": moment,
                "event_date": moment.date(),
                "topic": topic_for(kind),
                "partition": 0,
                "offset": 0,
                "ingest_time": datetime.now(UTC),
            }
        )
        if len(events) == CHUNK:
            producer.flush()
            flush_lake(final=number + 1 == start + count)
            start_of_chunk = number + 1
    producer.flush()
    flush_lake(final=True)
    producer.close()


def reconcile(env: dict[str, str]) -> tuple[int, float, dict[str, Any]]:
    started = time.monotonic()
    done = subprocess.run(
        [
            "/usr/bin/time",
            "-v",
            sys.executable,
            "-m",
            "outbox_cli.main",
            "reconcile",
            "--json",
            "-q",
        ],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
    )
    seconds = time.monotonic() - started
    match = re.search(r"Maximum resident set size \(kbytes\): (\d+)", done.stderr)
    if match is None or done.returncode not in (0, 1):
        raise SystemExit(f"reconcile failed ({done.returncode}): {done.stderr[-3000:]}")
    return int(match.group(1)), seconds, json.loads(done.stdout)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--first", type=int, default=100_000)
    parser.add_argument(
        "--cache-mb",
        type=int,
        action="append",
        default=[],
        help="Also run at the full size with this OUTBOX_RECONCILE_CACHE_MB (repeatable).",
    )
    arguments = parser.parse_args()
    total = arguments.events
    first = min(arguments.first, total)
    stack = StackSettings()  # OUTBOX_STACK_DIR, _DOWNLOADS, _JAVA, _POSTGRES_BIN as set
    settings = StackSettings(
        dir=stack.root / "bench-reconcile",
        postgres_port=free_port(),
        broker_port=free_port(),
        broker_controller_port=free_port(),
        downloads=stack.downloads_root,
        java=stack.java,
        postgres_bin=stack.postgres_bin,
        postgres_server_dir=None,  # never the server folder of the stack itself
    )
    cluster = PostgresCluster(settings)
    broker = KafkaBroker(settings)
    cluster.up()
    broker.up()
    print(f"broker: {broker.describe()} on {broker.bootstrap_servers}")
    try:
        cluster.drop_database("reconcile_bench")
        cluster.ensure_database("reconcile_bench")
        url = cluster.url("reconcile_bench")
        engine = sa.create_engine(url)
        with engine.begin() as connection:
            outbox_migrations.upgrade(connection)
        engine.dispose()
        prefix = f"b{uuid.uuid4().hex[:6]}"
        admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap_servers)
        admin.create_topics(
            [NewTopic(topic_for(f"{prefix}t{i}"), PARTITIONS, 1) for i in range(TYPES)]
        )
        admin.close()
        with tempfile.TemporaryDirectory(prefix="reconcile-bench-") as work:
            lake = Path(work) / "lake"
            env = {
                "OUTBOX_DATABASE_URL": url,
                "OUTBOX_KAFKA_BOOTSTRAP_SERVERS": broker.bootstrap_servers,
                "OUTBOX_LAKE_ROOT": str(lake),
                "OUTBOX_LAKE_TOPIC_PATTERN": rf"^outbox\.event\.{prefix}",
                "OUTBOX_RECONCILE_WORK_DIR": work,
            }
            done = 0
            for target in (first, total):
                t0 = time.monotonic()
                produce_and_land(broker.bootstrap_servers, lake, prefix, done, target - done)
                done = target
                print(f"{done:,} events on Kafka and in the lake ({time.monotonic() - t0:.0f} s)")
                runs = [("64", env)] + [
                    (str(mb), {**env, "OUTBOX_RECONCILE_CACHE_MB": str(mb)})
                    for mb in (arguments.cache_mb if target == total else [])
                ]
                for cache_mb, run_env in runs:
                    report_run(done, cache_mb, *reconcile(run_env))
    finally:
        broker.down()
        shutil.rmtree(broker.home, ignore_errors=True)  # its topics: gigabytes at full size
        cluster.down()


def report_run(
    done: int, cache_mb: str, rss_kb: int, seconds: float, report: dict[str, Any]
) -> None:
    figures = report["figures"]
    print(
        f"reconcile over {done:,} events (cache {cache_mb} MB): "
        f"peak RSS {rss_kb / 1024:.0f} MiB, "
        f"{seconds:.0f} s ({done / seconds:,.0f} events/s); kafka_events "
        f"{figures['kafka_events']:,}, lake_events {figures['lake_events']:,}, "
        f"typed_rows {figures['typed_rows']:,}, findings {report['finding_count']}"
    )


if __name__ == "__main__":
    main()
