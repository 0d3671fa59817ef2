"""The lake job end to end on the native stack: SDK → relay → Kafka → Spark → Delta, read back
with an independent reader (``deltalake``), never with Spark."""

from __future__ import annotations

import json
import os
import re
import signal
import uuid
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import pytest
from deltalake import DeltaTable
from kafka import KafkaProducer

from outbox import Event, Outbox
from outbox.core.contract import event_id_of, topic_for
from tests.cli import run_outbox
from tests.fix_lake import batches_landed, continuous_ingest, ingested, lake_env, rows
from tests.fix_postgres import ROOT
from tests.fix_relay import RelayBench, wait_until
from tests.kafka_read import read_until

pytestmark = pytest.mark.timeout(600)


def publish(bench: RelayBench, events: list[Event]) -> None:
    with bench.database.connect() as connection, connection.transaction():
        Outbox().publish_many(connection, events)


def relay_all(bench: RelayBench) -> None:
    with bench.in_thread():
        wait_until(lambda: bench.undelivered() == 0, timeout=120, what="relayed")


def test_events_land_exactly_once_with_typed_tables_and_quarantine(
    relay_bench: RelayBench, tmp_path: Path
) -> None:
    prefix = f"l{uuid.uuid4().hex[:8]}"
    order, payment = f"{prefix}order", f"{prefix}payment"
    committed = [
        Event(
            order, str(n % 4), "OrderPlaced", {"total": n * 1.5, "customer": f"c{n}", "lines": [n]}
        )
        for n in range(20)
    ] + [Event(payment, str(n), "PaymentTaken", {"amount": n}) for n in range(5)]
    publish(relay_bench, committed)
    with relay_bench.database.connect() as connection:
        with connection.transaction():
            Outbox().publish(connection, Event(order, "ghost", "OrderPlaced", {"total": 1.0}))
            raise psycopg.Rollback
    relay_all(relay_bench)
    producer = KafkaProducer(bootstrap_servers=relay_bench.kafka.bootstrap_servers)
    producer.send(topic_for(order), key=b"9", value=b"{not json", headers=[("eventType", b"X")])
    producer.flush()
    root = tmp_path / "lake"
    env = lake_env(root, prefix, relay_bench.kafka.bootstrap_servers)
    ingested(env)

    events = rows(root, "events")
    assert sorted(row["event_id"] for row in events) == sorted(str(e.event_id) for e in committed)
    assert not any(row["aggregate_id"] == "ghost" for row in events)
    first = next(row for row in events if row["event_id"] == str(committed[0].event_id))
    assert json.loads(first["payload"]) == {"total": 0.0, "customer": "c0", "lines": [0]}
    assert first["topic"] == topic_for(order) and first["event_date"] is not None
    typed = rows(root, f"aggregate_{order}")
    assert len(typed) == 20 and {"total", "customer", "lines"} <= set(typed[0])
    assert len(rows(root, f"aggregate_{payment}")) == 5
    (poison,) = rows(root, "quarantine")
    assert poison["value"] == b"{not json" and "no 'id' header" in poison["reason"]

    # The same records again through another path, a new field, and a type that changes.
    records: list[Any] = read_until(
        relay_bench.kafka.bootstrap_servers, topic_for(order), lambda r: len(r) >= 21
    )
    for record in records:
        producer.send(
            record.topic, key=record.key, value=record.value, headers=list(record.headers)
        )
    producer.flush()
    producer.close()
    later = [
        Event(order, "1", "OrderPlaced", {"total": 3.0, "customer": "c", "coupon": "XMAS"}),
        Event(order, "2", "OrderPlaced", {"total": "lots", "customer": "c"}),
    ]
    publish(relay_bench, later)
    relay_all(relay_bench)
    ingested(env)

    events = rows(root, "events")
    expected = {str(e.event_id) for e in committed + later}
    assert len(events) == len(expected) and {row["event_id"] for row in events} == expected
    typed = rows(root, f"aggregate_{order}")
    assert len(typed) == 21  # the new field's event; the changed type's is in quarantine
    assert (
        next(row for row in typed if row["event_id"] == str(later[0].event_id))["coupon"] == "XMAS"
    )
    assert all(row["coupon"] is None for row in typed if row["event_id"] != str(later[0].event_id))
    quarantined = {row["event_id"]: row["reason"] for row in rows(root, "quarantine")}
    # total's first value, 0.0, made a decimal column (JSON cannot tell a float from a Decimal)
    assert "'total' is string here but decimal(38,18)" in quarantined[str(later[1].event_id)]
    # The poison record's copy is another Kafka record (new offset): quarantined too, once.
    coordinates = [(r["topic"], r["partition"], r["offset"]) for r in rows(root, "quarantine")]
    assert len(coordinates) == len(set(coordinates)) == 3

    listed = run_outbox("lake", "tables", env=env)
    assert listed.returncode == 0 and "events" in listed.stdout, listed.stderr
    answer = run_outbox(
        "lake",
        "query",
        "--format",
        "csv",
        "SELECT count(*) FROM events WHERE event_type = 'OrderPlaced'",
        env=env,
    )
    assert answer.returncode == 0, answer.stderr
    assert answer.stdout.splitlines()[1] == "22"
    bad = run_outbox("lake", "query", "SELECT nope FROM events", env=env)
    assert bad.returncode == 2 and "query error" in bad.stderr

    before = {row["event_id"] for row in rows(root, "events")}
    maintained = run_outbox("lake", "maintain", env=env)
    assert maintained.returncode == 0, maintained.stderr
    compacted = re.search(r"^events\s+compacted (\d+) files into (\d+)", maintained.stdout, re.M)
    assert compacted is not None and int(compacted[1]) > int(compacted[2]), maintained.stdout
    assert {row["event_id"] for row in rows(root, "events")} == before


def test_a_killed_driver_resumes_without_loss_or_duplicate_and_new_topics_are_found(
    relay_bench: RelayBench, tmp_path: Path
) -> None:
    """Malformed records lie between the events (50 after every 3,000), so batches on both
    sides of the kill hold quarantine rows: after the restart each is in quarantine once."""
    prefix = f"k{uuid.uuid4().hex[:8]}"
    first_type, later_type = f"{prefix}a", f"{prefix}b"
    backlog = [Event(first_type, str(n % 50), "Tick", {"n": n}) for n in range(6_000)]
    malformed = KafkaProducer(bootstrap_servers=relay_bench.kafka.bootstrap_servers, acks="all")
    bad_offsets = set()
    for start in range(0, len(backlog), 3000):
        publish(relay_bench, backlog[start : start + 3000])
        relay_all(relay_bench)
        for n in range(50):  # no headers, not JSON: each record goes to quarantine
            sent = malformed.send(topic_for(first_type), key=str(n).encode(), value=b"\xff{")
            metadata = sent.get(timeout=30)
            bad_offsets.add((metadata.partition, metadata.offset))
    malformed.close()
    root = tmp_path / "lake"
    env = lake_env(
        root, prefix, relay_bench.kafka.bootstrap_servers, OUTBOX_LAKE_MAX_RECORDS_PER_BATCH="2000"
    )
    with continuous_ingest(env, tmp_path / "ingest.log") as job:
        wait_until(lambda: batches_landed(root) >= 2, timeout=240, what="a few batches")
        os.killpg(job.pid, signal.SIGKILL)  # the driver dies, mid-batch or between two
        job.wait(timeout=30)
    landed = len(rows(root, "events"))
    assert 0 < landed < len(backlog), "killed too late (or too early) to prove anything"
    quarantine_table = root / "quarantine" / "_delta_log"
    before = len(rows(root, "quarantine")) if quarantine_table.exists() else 0
    assert before < len(bad_offsets), "the restart must have malformed records left to set aside"

    # Restarted, continuous: it resumes, and finds a topic created after it started.
    with continuous_ingest(env, tmp_path / "ingest2.log"):
        wait_until(
            lambda: len(rows(root, "events")) >= len(backlog), timeout=300, what="backlog done"
        )
        newcomers = [Event(later_type, "1", "Tock", {"m": m}) for m in range(10)]
        publish(relay_bench, newcomers)
        relay_all(relay_bench)
        wait_until(
            lambda: len(rows(root, "events")) >= len(backlog) + 10,
            timeout=120,
            what="the new topic's events land",
        )
    events = rows(root, "events")
    ids = [row["event_id"] for row in events]
    assert len(ids) == len(set(ids)) == len(backlog) + 10
    quarantined = [(row["partition"], row["offset"]) for row in rows(root, "quarantine")]
    assert len(quarantined) == len(set(quarantined)), "a malformed record quarantined twice"
    assert set(quarantined) == bad_offsets, "malformed records missing from quarantine"
    assert set(ids) == {str(e.event_id) for e in backlog + newcomers}
    assert {event_id_of([("id", i.encode())]) for i in ids}  # every id is a UUID


def analysts_sql() -> list[str]:
    """Every SQL example of docs/analysts.md: ```sql blocks, `outbox lake query "..."` lines,
    inline `SELECT ...` and the Spark examples' SQL (standard SQL that DuckDB runs as well)."""
    text = (ROOT / "docs" / "analysts.md").read_text()
    found = re.findall(r"```sql\n(.*?)```", text, re.S)
    found += re.findall(r'^outbox lake query "(.*)"', text, re.M)
    found += re.findall(r'spark\.sql\("""(.*?)"""\)', text, re.S)
    found += re.findall(r"(?<!`)`(SELECT [^`]+)`", text)  # inline examples
    return [sql.strip() for sql in found]


def test_every_sql_example_of_the_analysts_guide_runs_on_a_lake_the_job_filled(
    kafka_services: Any, tmp_path: Path
) -> None:
    from outbox.core.contract import record_for
    from outbox.core.payload import encode_json
    from outbox_lake.query import run_sql
    from outbox_lake.settings import LakeSettings

    # The guide's `order` type, as an aggregate type of this test's own: other tests of the
    # session publish orders too, and the first `total` on a topic decides its column.
    aggregate = f"order{uuid.uuid4().hex[:8]}"
    table = f"aggregate_{aggregate}"
    examples = [
        re.sub(r"\baggregate_order\b", table, sql).replace("'order'", f"'{aggregate}'")
        for sql in analysts_sql()
    ]
    assert len(examples) >= 9, examples
    producer = KafkaProducer(bootstrap_servers=kafka_services.bootstrap_servers)
    # Totals as the example order service publishes them: Decimal sums of prices in cents.
    totals = [Decimal(n * 1999 + 1) / 100 for n in range(30)]
    for n, total in enumerate(totals):
        record = record_for(
            event_id=uuid.uuid4(),
            aggregate_type=aggregate,
            aggregate_id=str(n % 7),
            event_type="OrderPaid" if n % 3 == 0 else "OrderPlaced",
            payload_text=encode_json({"customer": f"c{n % 4}", "total": total}),
            headers_text="{}",
            traceparent="",
            position=n,
        )
        producer.send(
            record.topic, key=record.key, value=record.value, headers=list(record.headers)
        )
    producer.flush()
    root = tmp_path / "lake"
    env = {
        "OUTBOX_LAKE_ROOT": str(root),
        "OUTBOX_LAKE_TOPIC_PATTERN": rf"^outbox\.event\.{aggregate}$",
        "OUTBOX_KAFKA_BOOTSTRAP_SERVERS": kafka_services.bootstrap_servers,
    }
    ingested(env)
    settings = LakeSettings(root=str(root))
    # A clean lake (nothing set aside yet): every documented query runs all the same.
    for sql in examples:
        columns, _answer = run_sql(settings, sql)
        assert columns, sql
    assert run_sql(settings, "SELECT count(*) FROM quarantine")[1] == [(0,)]
    producer.send(topic_for(aggregate), key=b"x", value=b"{not json")
    producer.flush()
    producer.close()
    ingested(env)
    for sql in examples:
        columns, answer = run_sql(settings, sql)
        assert columns and answer, sql
    # Money sums without a cast, to the cent: the totals landed in a decimal column.
    _, [[summed]] = run_sql(settings, f"SELECT sum(total) FROM {table}")
    assert summed == sum(totals), (summed, sum(totals))
    kinds = {f.name: f.type for f in DeltaTable(str(root / table)).schema().fields}
    assert str(kinds["total"].type) == "decimal(38,18)", kinds["total"]
    paid = run_outbox(
        "lake",
        "query",
        "--format",
        "csv",
        "SELECT count(*) FROM events WHERE event_type = 'OrderPaid'",
        env=env,
    )
    assert paid.returncode == 0, paid.stderr
    assert int(paid.stdout.splitlines()[1]) == 10
