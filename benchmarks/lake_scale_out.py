"""The lake job on a Spark standalone cluster: ingest rate with one and with two workers.

A master and N workers from the PySpark installation, on loopback
(stack/outbox_stack/spark_cluster.py), each worker with one core and 1 GiB; the same events (a topic
of 4 partitions on the local broker) ingested once per cluster size with the real sink, and in
local[2] for reference. On a 2-core machine the two-worker figure shows that the job spreads its
read and parse over executors, not a speed-up the machine cannot give: the driver and the broker
share the same two cores.

    python -m benchmarks.lake_scale_out [--events 40000]
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
from pathlib import Path

from deltalake import DeltaTable
from kafka.admin import KafkaAdminClient, NewTopic

from benchmarks._shared import postgres_and_broker
from benchmarks.lake_ingest import lake_settings, produce
from outbox.settings import KafkaSettings
from outbox_lake.ingest import Ingest
from outbox_lake.session import spark_session
from outbox_stack.spark_cluster import SparkCluster


def produce_on_partitions(bootstrap: str, aggregate_type: str, events: int) -> None:
    """The lake benchmark's events, on a topic of 4 partitions (so executors share it)."""
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    admin.create_topics([NewTopic(f"outbox.event.{aggregate_type}", 4, 1)])
    admin.close()
    produce(bootstrap, f"outbox.event.{aggregate_type}", 0, 0, events)


def rate(master: str, root: Path, bootstrap: str, aggregate_type: str, events: int) -> float:
    settings = lake_settings(
        root=str(root),
        topic_pattern=rf"^outbox\.event\.{aggregate_type}$",
        spark_master=master,
    )
    spark = spark_session(settings)
    try:
        started = time.monotonic()
        kafka = KafkaSettings(bootstrap_servers=bootstrap)
        Ingest(spark, settings, kafka).run(threading.Event(), available_now=True)
        elapsed = time.monotonic() - started
    finally:
        spark.stop()
    landed = DeltaTable(settings.table_uri("events")).to_pyarrow_dataset().count_rows()
    if landed != events:
        raise RuntimeError(f"{landed} rows landed of {events}")
    return events / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description="Lake ingest on a Spark standalone cluster.")
    parser.add_argument("--events", type=int, default=40_000)
    arguments = parser.parse_args()
    stack = postgres_and_broker()
    bootstrap = stack.bootstrap_servers
    work = Path(tempfile.mkdtemp(prefix="outbox-scale-out-"))
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores; workers of 1 core, 1 GiB")
    try:
        aggregate_type = f"scale{uuid.uuid4().hex[:8]}"
        produce_on_partitions(bootstrap, aggregate_type, arguments.events)
        results = {}
        results["local[2]"] = rate(
            "local[2]", work / "local", bootstrap, aggregate_type, arguments.events
        )
        for workers in (1, 2):
            cluster = SparkCluster(work / f"spark{workers}", workers=workers)
            cluster.up()
            try:
                results[f"{workers} worker(s)"] = rate(
                    cluster.master_url,
                    work / f"w{workers}",
                    bootstrap,
                    aggregate_type,
                    arguments.events,
                )
            finally:
                cluster.down()
        for name, value in results.items():
            print(f"ingest, {name:<12}: {value:>9,.0f} events/s")
        print(f"two workers / one worker : {results['2 worker(s)'] / results['1 worker(s)']:>9.2f}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
