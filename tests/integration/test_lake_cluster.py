"""The lake job, unchanged, on a Spark standalone cluster (a master and two workers on this
machine, from the PySpark installation): the executors write the Delta files, and a worker
killed mid-batch loses and duplicates nothing."""

from __future__ import annotations

import json
import os
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from outbox_lake.names import typed_table_name
from outbox_stack.spark_cluster import SparkCluster
from tests.fix_lake import batches_landed, continuous_ingest, contract_record, lake_env, rows, send
from tests.fix_relay import wait_until
from tests.fix_stack import KafkaServices

pytestmark = pytest.mark.timeout(900)


@pytest.fixture
def spark_cluster(tmp_path: Path) -> Iterator[SparkCluster]:
    cluster = SparkCluster(tmp_path / "spark", workers=2, cores=1, memory="1g")
    cluster.up()
    try:
        yield cluster
    finally:
        cluster.down()


def event_log_writes(folder: Path) -> dict[str, int]:
    """Records written per executor id, from the application's Spark event log."""
    written: dict[str, int] = {}
    logs = [path for path in folder.iterdir() if path.is_file()]
    assert logs, f"no event log in {folder}: {list(folder.iterdir())}"
    for log in logs:
        for line in log.read_text().splitlines():
            event = json.loads(line)
            if event.get("Event") != "SparkListenerTaskEnd":
                continue
            executor = event["Task Info"]["Executor ID"]
            metrics = event.get("Task Metrics") or {}
            records = (metrics.get("Output Metrics") or {}).get("Records Written", 0)
            written[executor] = written.get(executor, 0) + int(records)
    return written


def test_the_executors_write_and_a_worker_killed_mid_batch_loses_nothing(
    kafka_services: KafkaServices, spark_cluster: SparkCluster, tmp_path: Path
) -> None:
    prefix = f"sc{uuid.uuid4().hex[:8]}"
    aggregate_type = f"{prefix}order"
    records = [
        contract_record(aggregate_type, json.dumps({"n": n}), aggregate_id=str(n % 40))
        for n in range(3000)
    ]
    bootstrap = kafka_services.bootstrap_servers
    send(bootstrap, [(r.topic, r.key, r.value, list(r.headers)) for r in records])
    send(bootstrap, [(r.topic, r.key, r.value, list(r.headers)) for r in records[:500]])
    root = tmp_path / "lake"
    conf = tmp_path / "conf"
    events_log = tmp_path / "events"
    conf.mkdir()
    events_log.mkdir()
    (conf / "spark-defaults.conf").write_text(
        # One plain file (Spark 4 rolls and compresses event logs by default).
        f"spark.eventLog.enabled true\nspark.eventLog.dir {events_log}\n"
        "spark.eventLog.rolling.enabled false\nspark.eventLog.compress false\n"
    )
    env = lake_env(
        root,
        prefix,
        bootstrap,
        OUTBOX_LAKE_SPARK_MASTER=spark_cluster.master_url,
        OUTBOX_LAKE_MAX_RECORDS_PER_BATCH="1000",
        SPARK_CONF_DIR=str(conf),
    )
    log = tmp_path / "ingest.log"
    with continuous_ingest(env, log) as job:
        wait_until(lambda: batches_landed(root) >= 2, timeout=400, what="a first batch landed")
        victim, *_ = spark_cluster.worker_pids()
        os.kill(victim, signal.SIGKILL)  # mid-batch: the next batches start at once
        wait_until(
            lambda: len(rows(root, "events")) >= len(records),
            timeout=500,
            what="every event landed after a worker was killed",
        )
        os.kill(job.pid, signal.SIGTERM)
        assert job.wait(timeout=180) == 0, log.read_text()[-3000:]

    expected = {str(uuid.UUID(dict(r.headers)["id"].decode())) for r in records}
    for table in ("events", typed_table_name(aggregate_type)):
        ids = [row["event_id"] for row in rows(root, table)]
        assert len(ids) == len(set(ids)) == len(expected) and set(ids) == expected, table
    written = event_log_writes(events_log)
    assert sum(written.values()) >= len(records), written
    assert written.get("driver", 0) == 0, written  # every row written by an executor
    assert [e for e, n in written.items() if n], written  # the executors wrote
