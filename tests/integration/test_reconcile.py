"""``outbox reconcile`` and ``outbox trace`` on the native stack, against broken states.

One pipeline is built per module (SDK -> polling relay -> Kafka -> ``outbox lake ingest``:
Spark is slow here); each test breaks a copy of its lake, or the outbox for the time of the
test, or Kafka on a topic of its own, and checks the finding and the exit code.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import pytest
import sqlalchemy as sa
from deltalake import DeltaTable, write_deltalake
from kafka import KafkaProducer

import outbox_migrations
from outbox import Event, Outbox
from tests.cli import run_outbox
from tests.fix_lake import ingested, lake_env
from tests.fix_postgres import ScratchDatabase
from tests.fix_relay import RelayBench, wait_until
from tests.fix_stack import KafkaServices

pytestmark = pytest.mark.timeout(900)

AGGREGATES = 3
EVENTS_PER_AGGREGATE = 8


@dataclass
class Pipeline:
    database: ScratchDatabase
    bootstrap: str
    prefix: str
    lake: Path
    event_ids: list[str]

    def env(self, lake: Path, **extra: str) -> dict[str, str]:
        return {
            "OUTBOX_DATABASE_URL": self.database.url,
            "OUTBOX_KAFKA_BOOTSTRAP_SERVERS": self.bootstrap,
            "OUTBOX_LAKE_ROOT": str(lake),
            "OUTBOX_LAKE_TOPIC_PATTERN": rf"^outbox\.event\.{self.prefix}a",
            **extra,
        }

    def lake_copy(self, tmp_path: Path) -> Path:
        copy = tmp_path / "lake"
        shutil.copytree(self.lake, copy)
        return copy

    def reconcile(self, lake: Path, *args: str, **env: str) -> tuple[int, dict[str, Any]]:
        done = run_outbox("reconcile", "--json", "--quiet", *args, env=self.env(lake, **env))
        assert done.returncode in (0, 1), done.stderr[-3000:]
        assert done.stdout.strip(), done.stderr[-3000:]
        return done.returncode, json.loads(done.stdout)

    def trace(self, lake: Path, event_id: str) -> subprocess.CompletedProcess[str]:
        return run_outbox("trace", "--json", event_id, env=self.env(lake))


def kinds(report: dict[str, Any]) -> dict[str, int]:
    counted: dict[str, int] = {}
    for finding in report["findings"]:
        counted[finding["kind"]] = counted.get(finding["kind"], 0) + finding["count"]
    return counted


@pytest.fixture(scope="module")
def pipeline(
    kafka_services: KafkaServices, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Pipeline]:
    tmp = tmp_path_factory.mktemp("reconcile")
    database = ScratchDatabase(kafka_services.cluster, f"outbox_test_rec_{uuid.uuid4().hex[:8]}")
    database.cluster.ensure_database(database.name)
    engine = sa.create_engine(database.url)
    with engine.begin() as connection:
        outbox_migrations.upgrade(connection)
    engine.dispose()
    prefix = f"r{uuid.uuid4().hex[:8]}"
    event_ids: list[str] = []
    with psycopg.connect(database.conninfo) as connection:
        for round_ in range(EVENTS_PER_AGGREGATE):
            for kind in ("aorder", "apayment"):
                with connection.transaction():
                    for aggregate in range(AGGREGATES):
                        event = Event(prefix + kind, str(aggregate), "Changed", {"round": round_})
                        Outbox().publish(connection, event)
                        event_ids.append(str(event.event_id))
    bench = RelayBench(database, kafka_services, tmp)
    with bench.in_thread():
        wait_until(lambda: bench.undelivered() == 0, timeout=120, what="relayed")
    lake = tmp / "lake"
    ingested(lake_env(lake, f"{prefix}a", kafka_services.bootstrap_servers))
    try:
        yield Pipeline(database, kafka_services.bootstrap_servers, prefix, lake, event_ids)
    finally:
        database.cluster.drop_database(database.name)


TOTAL = 2 * AGGREGATES * EVENTS_PER_AGGREGATE


def test_a_clean_pipeline_reports_nothing_and_exits_0(pipeline: Pipeline) -> None:
    status, report = pipeline.reconcile(pipeline.lake)
    assert status == 0, report["findings"]
    assert report["clean"] is True and report["findings"] == []
    figures = report["figures"]
    assert figures["kafka_events"] == figures["lake_events"] == TOTAL
    assert figures["typed_rows"] == TOTAL
    assert figures["lake_pending_ingest"] == 0
    assert figures["outbox_rows"] == 0
    human = run_outbox("reconcile", env=pipeline.env(pipeline.lake))
    assert human.returncode == 0, human.stderr[-3000:]
    assert "no findings" in human.stdout
    assert "Kafka records" in human.stderr and "lake rows" in human.stderr  # progress


def test_an_event_deleted_from_the_lake_is_missing_in_lake(
    pipeline: Pipeline, tmp_path: Path
) -> None:
    lake = pipeline.lake_copy(tmp_path)
    gone = pipeline.event_ids[1]  # round 0, the first type
    DeltaTable(str(lake / "events")).delete(f"event_id = '{gone}'")
    status, report = pipeline.reconcile(lake)
    assert status == 1
    assert kinds(report) == {"missing_in_lake": 1}
    (finding,) = report["findings"]
    assert finding["examples"][0]["event_id"] == gone
    assert finding["aggregate_type"] == pipeline.prefix + "aorder"
    # A window that ends before the event leaves it out: nothing to report there.
    first_ms = uuid.UUID(pipeline.event_ids[0]).int >> 80
    moment = datetime.fromtimestamp((first_ms + 1) / 1000, UTC).isoformat()
    status, report = pipeline.reconcile(lake, "--until", moment)
    assert status == 0, report["findings"]
    assert report["figures"]["lake_events"] >= 1


def test_a_duplicate_inserted_into_the_lake_is_reported(pipeline: Pipeline, tmp_path: Path) -> None:
    lake = pipeline.lake_copy(tmp_path)
    events = DeltaTable(str(lake / "events"))
    copy = events.to_pyarrow_table().slice(0, 1)
    write_deltalake(str(lake / "events"), copy, mode="append")
    status, report = pipeline.reconcile(lake)
    assert status == 1
    assert kinds(report) == {"duplicate_in_lake": 1}
    assert report["findings"][0]["examples"][0]["event_id"] == copy.column("event_id")[0].as_py()


def test_a_lake_row_whose_event_never_reached_kafka_is_reported(
    pipeline: Pipeline, tmp_path: Path
) -> None:
    lake = pipeline.lake_copy(tmp_path)
    events = DeltaTable(str(lake / "events"))
    row = events.to_pyarrow_table().slice(0, 1).to_pylist()[0]
    phantom = str(uuid.UUID(int=uuid.UUID(row["event_id"]).int ^ 0xFFFF))
    row = {**row, "event_id": phantom, "position": 10**12}
    schema = pa.schema(events.schema().to_arrow())
    write_deltalake(str(lake / "events"), pa.Table.from_pylist([row], schema=schema), mode="append")
    status, report = pipeline.reconcile(lake)
    assert status == 1
    found = kinds(report)
    assert found["not_on_kafka"] == 1
    # The phantom came after the version the typed tables have reached: not judged there.
    assert "typed_row_missing" not in found
    assert set(found) <= {"not_on_kafka", "typed_row_missing", "lake_order_violation"}


def test_a_record_published_out_of_position_order_is_a_kafka_order_violation(
    pipeline: Pipeline,
) -> None:
    from outbox.core.contract import record_for

    aggregate_type = pipeline.prefix + "zlate"  # outside the other tests' topic pattern
    ids = [uuid.uuid4() for _ in range(3)]
    producer = KafkaProducer(bootstrap_servers=pipeline.bootstrap)
    try:
        for event_id, position in zip(ids, (10, 30, 20), strict=True):
            record = record_for(
                event_id=event_id,
                aggregate_type=aggregate_type,
                aggregate_id="7",
                event_type="Late",
                payload_text="{}",
                headers_text="{}",
                traceparent="",
                position=position,
            )
            producer.send(
                record.topic, key=record.key, value=record.value, headers=list(record.headers)
            ).get(timeout=30)
    finally:
        producer.close()
    every_topic = rf"^outbox\.event\.{pipeline.prefix}"
    status, report = pipeline.reconcile(pipeline.lake, OUTBOX_LAKE_TOPIC_PATTERN=every_topic)
    assert status == 1
    assert kinds(report) == {"kafka_order_violation": 1}
    (finding,) = report["findings"]
    assert finding["aggregate_type"] == aggregate_type
    assert finding["examples"][0]["event_id"] == str(ids[2])
    assert finding["examples"][0]["after_position"] == 30
    assert report["figures"]["lake_pending_ingest"] == 3  # not ingested: not "missing"


def test_a_record_no_reader_can_decode_is_a_finding_with_its_offsets_and_trace_says_so(
    pipeline: Pipeline,
) -> None:
    """Issue 22, item 1: a header name that is not UTF-8 (a batch crafted on the wire) made
    reconcile and trace crash; now reconcile reads past it and reports it, and trace lists it
    while it finds the copy after it."""
    from outbox.core.contract import event_id_of, topic_for
    from tests.kafka_wire import contract_record, craft_bad_record, own_topic, send

    aggregate_type = pipeline.prefix + "zbad"  # outside the lake's pattern: not ingested
    topic = topic_for(aggregate_type)
    pattern = rf"^outbox\.event\.{pipeline.prefix}(a|zbad)"
    with own_topic(pipeline.bootstrap, topic):
        good = [contract_record(aggregate_type, n) for n in range(3)]
        bad_offset = craft_bad_record(pipeline.bootstrap, aggregate_type, good[:2])
        send(pipeline.bootstrap, good[2:])
        status, report = pipeline.reconcile(pipeline.lake, OUTBOX_LAKE_TOPIC_PATTERN=pattern)
        assert status == 1
        assert kinds(report) == {"kafka_undecodable": 1}
        (finding,) = report["findings"]
        assert finding["aggregate_type"] == aggregate_type
        (example,) = finding["examples"]
        assert (example["topic"], example["partition"], example["offset"]) == (topic, 0, 1)
        assert bad_offset == 1 and "is not UTF-8" in example["reason"]
        assert report["figures"]["kafka_undecodable_records"] == 1
        assert report["figures"]["kafka_events"] == TOTAL + 3  # read past it, to the end
        last = str(event_id_of(good[2].headers))
        traced = run_outbox(
            "trace",
            "--json",
            "--scan-kafka",
            last,
            env=pipeline.env(pipeline.lake, OUTBOX_LAKE_TOPIC_PATTERN=pattern),
        )
        assert traced.returncode == 0, traced.stderr[-3000:]
        lineage = json.loads(traced.stdout)
        assert [(c["topic"], c["offset"]) for c in lineage["kafka"]] == [(topic, 3)]
        (unread,) = lineage["kafka_undecodable"]
        assert (unread["topic"], unread["partition"], unread["offset"]) == (topic, 0, 1)
        human = run_outbox(
            "trace",
            "--scan-kafka",
            last,
            env=pipeline.env(pipeline.lake, OUTBOX_LAKE_TOPIC_PATTERN=pattern),
        )
        assert f"undecodable record {topic}[0]@1: header name" in human.stdout


def test_a_row_stuck_in_the_outbox_and_a_dead_letter_are_reported(pipeline: Pipeline) -> None:
    event = Event(pipeline.prefix + "aorder", "0", "Stuck", {"round": 99})
    with psycopg.connect(pipeline.database.conninfo) as connection:
        with connection.transaction():
            Outbox().publish(connection, event)
        connection.execute(
            "INSERT INTO outbox.outbox_dead_letter (id, aggregatetype, aggregateid, type, "
            "payload, headers, traceparent, position, created_at, reason) VALUES "
            "(%s, %s, '1', 'Refused', '{}', '{}', '', 999999, now(), "
            "'MessageSizeTooLargeError: the record is too large')",
            (str(uuid.uuid4()), pipeline.prefix + "apayment"),
        )
        connection.commit()
    try:
        status, report = pipeline.reconcile(pipeline.lake)
        assert status == 1
        assert kinds(report) == {"dead_letter": 1}, "a row younger than the threshold is not stuck"
        assert report["figures"]["outbox_rows_in_flight"] == 1
        status, report = pipeline.reconcile(
            pipeline.lake, OUTBOX_RECONCILE_STUCK_AFTER_SECONDS="0.001"
        )
        assert status == 1
        assert kinds(report) == {"outbox_stuck": 1, "dead_letter": 1}
        by_type = report["by_aggregate_type"]
        assert by_type[pipeline.prefix + "aorder"] == {"outbox_stuck": 1}
        assert by_type[pipeline.prefix + "apayment"] == {"dead_letter": 1}
        stuck = next(f for f in report["findings"] if f["kind"] == "outbox_stuck")
        assert stuck["examples"][0]["event_id"] == str(event.event_id)
        traced = pipeline.trace(pipeline.lake, str(event.event_id))
        assert traced.returncode == 0, traced.stderr
        lineage = json.loads(traced.stdout)
        assert lineage["outbox"]["aggregate_id"] == "0"
        assert lineage["kafka"] == [] and lineage["lake"] == []
    finally:
        with psycopg.connect(pipeline.database.conninfo, autocommit=True) as connection:
            connection.execute("DELETE FROM outbox.outbox")
            connection.execute("DELETE FROM outbox.outbox_dead_letter")


def test_trace_follows_an_event_to_its_kafka_copy_and_delta_version(pipeline: Pipeline) -> None:
    event_id = pipeline.event_ids[-1]
    traced = pipeline.trace(pipeline.lake, event_id)
    assert traced.returncode == 0, traced.stderr
    lineage = json.loads(traced.stdout)
    assert lineage["outbox"] is None and lineage["dead_letter"] is None
    (row,) = lineage["lake"]
    (copy,) = lineage["kafka"]
    assert (copy["topic"], copy["partition"], copy["offset"]) == (
        row["topic"],
        row["partition"],
        row["offset"],
    )
    assert row["table"] == "events" and row["aggregate_type"] == pipeline.prefix + "apayment"
    version = row["delta_version"]
    assert (
        DeltaTable(str(pipeline.lake / "events"), version=version)
        .to_pyarrow_table(filters=[("event_id", "=", event_id)])
        .num_rows
        == 1
    )
    if version > 0:
        earlier = DeltaTable(str(pipeline.lake / "events"), version=version - 1)
        assert earlier.to_pyarrow_table(filters=[("event_id", "=", event_id)]).num_rows == 0
    assert lineage["typed"]["present"] is True
    assert lineage["latency"]["built_to_queryable"] > 0
    unknown = pipeline.trace(pipeline.lake, str(uuid.uuid4()))
    assert unknown.returncode == 1
    assert json.loads(unknown.stdout)["found"] is False


def test_an_unreachable_source_exits_2_naming_it_and_never_reports_clean(
    pipeline: Pipeline, tmp_path: Path
) -> None:
    from tests.fix_postgres import free_port

    closed = f"127.0.0.1:{free_port()}"
    no_kafka = run_outbox(
        "reconcile",
        "--quiet",
        env=pipeline.env(pipeline.lake, OUTBOX_KAFKA_BOOTSTRAP_SERVERS=closed),
    )
    assert no_kafka.returncode == 2, no_kafka.stdout + no_kafka.stderr
    assert "Kafka" in no_kafka.stderr and "OUTBOX_KAFKA_BOOTSTRAP_SERVERS" in no_kafka.stderr
    assert "no findings" not in no_kafka.stdout
    url = pipeline.database.url.replace(f":{pipeline.database.cluster.port}/", f":{free_port()}/")
    no_database = run_outbox(
        "reconcile", "--quiet", env=pipeline.env(pipeline.lake, OUTBOX_DATABASE_URL=url)
    )
    assert no_database.returncode == 2, no_database.stdout + no_database.stderr
    assert "outbox database" in no_database.stderr
    assert "Traceback" not in no_kafka.stderr + no_database.stderr
    no_lake = run_outbox("reconcile", "--quiet", env=pipeline.env(tmp_path / "nowhere"))
    assert no_lake.returncode == 2, no_lake.stdout + no_lake.stderr
    assert "OUTBOX_LAKE_ROOT" in no_lake.stderr
    bad_window = run_outbox("reconcile", "--since", "yesterday", env=pipeline.env(pipeline.lake))
    assert bad_window.returncode == 2
    assert "--since" in bad_window.stderr and "ISO 8601" in bad_window.stderr
