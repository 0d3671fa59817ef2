"""The lake job, unchanged, on a Spark standalone cluster (a master and two workers on this
machine, from the PySpark installation): the same tables, every event exactly once."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from outbox_lake.names import typed_table_name
from outbox_stack.spark_cluster import SparkCluster
from tests.fix_stack import KafkaServices
from tests.integration.test_lake_integrity import contract_record, env_for, ingested, rows, send

pytestmark = pytest.mark.timeout(600)


@pytest.fixture
def spark_cluster(tmp_path: Path) -> Iterator[SparkCluster]:
    cluster = SparkCluster(tmp_path / "spark", workers=2, cores=1, memory="1g")
    cluster.up()
    try:
        yield cluster
    finally:
        cluster.down()


def test_the_lake_job_runs_unchanged_on_a_standalone_cluster(
    kafka_services: KafkaServices, spark_cluster: SparkCluster, tmp_path: Path
) -> None:
    prefix = f"sc{uuid.uuid4().hex[:8]}"
    aggregate_type = f"{prefix}order"
    records = [
        contract_record(aggregate_type, json.dumps({"n": n}), aggregate_id=str(n % 40))
        for n in range(6000)
    ]
    bootstrap = kafka_services.bootstrap_servers
    send(bootstrap, [(r.topic, r.key, r.value, list(r.headers)) for r in records])
    send(bootstrap, [(r.topic, r.key, r.value, list(r.headers)) for r in records[:500]])
    root = tmp_path / "lake"
    ingested(
        env_for(
            root,
            prefix,
            bootstrap,
            OUTBOX_LAKE_SPARK_MASTER=spark_cluster.master_url,
            OUTBOX_LAKE_MAX_RECORDS_PER_BATCH="2000",
        )
    )

    expected = {str(uuid.UUID(dict(r.headers)["id"].decode())) for r in records}
    for table in ("events", typed_table_name(aggregate_type)):
        ids = [row["event_id"] for row in rows(root, table)]
        assert len(ids) == len(set(ids)) == len(expected) and set(ids) == expected, table
    state = spark_cluster.status()
    (app,) = [a for a in state["completedapps"] if a["name"] == "outbox-lake-ingest"]
    assert app["cores"] == 2, app  # both workers' executors took part
