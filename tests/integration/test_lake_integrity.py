"""Lake integrity on the native stack: no record halts the job, no operator step skips data,
commit order kept end to end. Read back with ``deltalake``, never with Spark."""

from __future__ import annotations

import json
import os
import shutil
import signal
import threading
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import psycopg
import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka.admin import KafkaAdminClient, NewTopic

from outbox import Event, Outbox, new_event_id
from outbox.core.contract import topic_for
from outbox.settings import KafkaSettings, OutboxSettings
from outbox_connect.settings import ConnectorSettings
from outbox_console import ConsoleSettings, Pipeline
from outbox_console.panels import Panel, lake_panel
from outbox_lake.names import typed_table_name
from outbox_lake.settings import LakeSettings
from tests.fix_lake import (
    batches_landed,
    continuous_ingest,
    contract_record,
    ingested,
    lake_env,
    refusal,
    rows,
    send,
)
from tests.fix_postgres import free_port
from tests.fix_relay import RelayBench, wait_until
from tests.fix_stack import KafkaServices

pytestmark = pytest.mark.timeout(600)


@dataclass(frozen=True)
class Sent:
    topic: str
    partition: int
    offset: int
    event_id: str | None
    """Set for a record that follows the contract: it must land in events."""


# -- no record stops the stream -------------------------------------------------------------

JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**80), max_value=2**80)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=12,
)
HARD_PAYLOADS = [
    '{"big": 9223372036854775808}',
    '{"small": -9223372036854775809}',
    '{"x": 1e400}',
    '{"Total": 1, "total": 2}',
    '{"EVENT_ID": "mine"}',
    '{"a b": 1, "c=d": 2}',
    '{"s": "\\ud800"}',
    "[1, 2]",
    '"just text"',
]
DEEP = '{"deep": ' + "[" * 3000 + "]" * 3000 + "}"


@dataclass(frozen=True)
class Drawn:
    kind: str  # "event" (must land in events) or "junk" (must land in quarantine)
    aggregate: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]]
    twice: bool


def drawn_records() -> st.SearchStrategy[Drawn]:
    payload = st.one_of(
        st.dictionaries(st.text(max_size=8), JSON_VALUES, max_size=6).map(json.dumps),
        JSON_VALUES.map(json.dumps),
        st.sampled_from(HARD_PAYLOADS),
    )
    event = st.builds(
        lambda text, aggregate, key, twice: (text, aggregate, key, twice),
        payload,
        st.integers(0, 2),
        st.text(max_size=12),
        st.booleans(),
    ).map(
        lambda drawn: Drawn(
            "event",
            drawn[1],
            drawn[2].encode(),
            drawn[0].encode(),
            list(contract_record("x", drawn[0], aggregate_id=drawn[2]).headers),
            drawn[3],
        )
    )
    header = st.tuples(
        st.text(min_size=1, max_size=10).filter(lambda name: name != "id"),
        st.binary(max_size=20),
    )
    junk = st.builds(
        lambda aggregate, key, value, headers: Drawn("junk", aggregate, key, value, headers, False),
        st.integers(0, 2),
        st.none() | st.binary(max_size=30),
        st.none() | st.binary(max_size=60),
        st.lists(header, max_size=4),
    ).filter(lambda record: record.key is not None or record.value is not None)
    broken = event.flatmap(
        lambda good: st.sampled_from(
            [
                ("key", b"\xff\xfe"),
                ("eventType", b"\xc3("),
                ("headers", b"{not json"),
                ("id", b"not-a-uuid"),
                ("position", b"-1"),
                ("value", b'{"nan": NaN}'),
            ]
        ).map(lambda change: _broken(good, *change))
    )
    return st.one_of(event, event, junk, broken)


def _broken(good: Drawn, part: str, bad: bytes) -> Drawn:
    if part == "key":
        return Drawn("junk", good.aggregate, bad, good.value, good.headers, False)
    if part == "value":
        return Drawn("junk", good.aggregate, good.key, bad, good.headers, False)
    headers = [(name, bad if name == part else value) for name, value in good.headers]
    return Drawn("junk", good.aggregate, good.key, good.value, headers, False)


def test_no_record_however_malformed_stops_the_lake(
    kafka_services: KafkaServices, tmp_path: Path
) -> None:
    """Hypothesis draws the records (valid events with arbitrary payloads, corrupted contract
    records, arbitrary bytes); one real job ingests them all."""
    drawn: list[Drawn] = []

    @settings(
        max_examples=250, database=None, deadline=None, suppress_health_check=list(HealthCheck)
    )
    @given(drawn_records())
    def collect(record: Drawn) -> None:
        drawn.append(record)

    collect()
    prefix = f"h{uuid.uuid4().hex[:8]}"
    types = [f"{prefix}a", f"{prefix}B", f"{prefix}.c"]
    outgoing = []
    for record in drawn:
        copies = 2 if record.twice else 1
        for _ in range(copies):
            outgoing.append(
                (topic_for(types[record.aggregate]), record.key, record.value, record.headers)
            )
    metadata = send(kafka_services.bootstrap_servers, outgoing)
    sent: list[Sent] = []
    flat = [record for record in drawn for _ in range(2 if record.twice else 1)]
    for record, meta in zip(flat, metadata, strict=True):
        event_id = dict(record.headers)["id"].decode() if record.kind == "event" else None
        sent.append(Sent(meta.topic, meta.partition, meta.offset, event_id))

    root = tmp_path / "lake"
    env = lake_env(root, prefix, kafka_services.bootstrap_servers)
    ingested(env)

    events = rows(root, "events")
    event_ids = [row["event_id"] for row in events]
    expected = {s.event_id for s in sent if s.event_id is not None}
    assert len(event_ids) == len(set(event_ids)), "an event landed twice"
    assert set(event_ids) == expected
    quarantine = rows(root, "quarantine")
    set_aside = {
        (q["topic"], q["partition"], q["offset"])
        for q in quarantine
        if q["target_table"] == "events"
    }
    junk = {(s.topic, s.partition, s.offset) for s in sent if s.event_id is None}
    assert set_aside == junk
    assert all(q["reason"] for q in quarantine)
    # Each event has its typed row, or its typed row is in quarantine with the reason: once.
    typed_ids: list[str] = []
    for aggregate_type in types:
        name = typed_table_name(aggregate_type)
        if (root / name).exists():
            typed = rows(root, name)
            assert {row["aggregate_type"] for row in typed} <= {aggregate_type}
            typed_ids += [row["event_id"] for row in typed]
    typed_ids += [q["event_id"] for q in quarantine if q["target_table"] != "events"]
    assert sorted(typed_ids) == sorted(expected)
    reasons = " | ".join(q["reason"] for q in quarantine)
    for hard in ("outside a 64-bit integer", "too large for a double", "differ only in case"):
        if hard_payload_drawn(drawn, hard):
            assert hard in reasons


def hard_payload_drawn(drawn: list[Drawn], reason: str) -> bool:
    marker = {
        "outside a 64-bit integer": b"9223372036854775808",
        "too large for a double": b"1e400",
        "differ only in case": b'"Total"',
    }[reason]
    return any(record.kind == "event" and marker in (record.value or b"") for record in drawn)


def test_the_hard_cases_each_land_in_events_with_their_typed_row_set_aside(
    kafka_services: KafkaServices, tmp_path: Path
) -> None:
    prefix = f"x{uuid.uuid4().hex[:8]}"
    aggregate_type = f"{prefix}order"
    records = [contract_record(aggregate_type, text) for text in [*HARD_PAYLOADS, DEEP]]
    big = contract_record(aggregate_type, '{"blob": "' + "z" * 1_500_000 + '"}')
    # Larger than Kafka's default record limit (1 MB): a topic that allows it, as ops set one.
    admin = KafkaAdminClient(bootstrap_servers=kafka_services.bootstrap_servers)
    try:
        admin.create_topics(
            [NewTopic(big.topic, 1, 1, topic_configs={"max.message.bytes": "4000000"})]
        )
    finally:
        admin.close()
    send(
        kafka_services.bootstrap_servers,
        [(r.topic, r.key, r.value, list(r.headers)) for r in [*records, big]],
    )
    root = tmp_path / "lake"
    ingested(
        lake_env(
            root,
            prefix,
            kafka_services.bootstrap_servers,
        )
    )
    events = {row["event_id"]: row for row in rows(root, "events")}
    ids = [str(uuid.UUID(dict(r.headers)["id"].decode())) for r in records]
    deep = ids[-1]
    # Every one is an event (the deep one too: the parser goes deeper than typing does).
    assert set(events) == {*ids, str(uuid.UUID(dict(big.headers)["id"].decode()))}
    assert events[ids[0]]["payload"] == HARD_PAYLOADS[0]  # the exact text, beyond int64
    assert events[ids[2]]["payload"] == '{"x": 1e400}'  # not "Infinity"
    set_aside = {q["event_id"]: q for q in rows(root, "quarantine")}
    quarantine = {event_id: row["reason"] for event_id, row in set_aside.items()}
    # each typed row set aside keeps its record's raw bytes
    assert (set_aside[ids[0]]["key"], set_aside[ids[0]]["value"]) == (
        records[0].key,
        records[0].value,
    )
    assert "nested too deeply" in quarantine[deep]
    assert "'big' = 9223372036854775808 is outside a 64-bit integer" in quarantine[ids[0]]
    assert "'x' is too large for a double" in quarantine[ids[2]]
    assert "'Total' and 'total' differ only in case" in quarantine[ids[3]]
    assert "clashes with the lake column 'event_id'" in quarantine[ids[4]]


# -- operator steps that must not skip data -------------------------------------------------


def test_a_deleted_checkpoint_re_reads_and_lands_new_events_exactly_once(
    kafka_services: KafkaServices, tmp_path: Path
) -> None:
    prefix = f"c{uuid.uuid4().hex[:8]}"
    aggregate_type = f"{prefix}order"
    first = [contract_record(aggregate_type, json.dumps({"n": n})) for n in range(40)]
    bootstrap = kafka_services.bootstrap_servers
    send(bootstrap, [(r.topic, r.key, r.value, list(r.headers)) for r in first])
    root = tmp_path / "lake"
    env = lake_env(root, prefix, bootstrap, OUTBOX_LAKE_MAX_RECORDS_PER_BATCH="20")
    ingested(env)
    assert len(rows(root, "events")) == 40
    assert batches_landed(root) >= 3  # the table's creation, then several batches

    shutil.rmtree(root / "_checkpoints")  # "safe: the sink dedups", thought the operator
    later = [contract_record(aggregate_type, json.dumps({"n": n})) for n in range(40, 45)]
    send(bootstrap, [(r.topic, r.key, r.value, list(r.headers)) for r in later])
    ingested(env)

    for table in ("events", typed_table_name(aggregate_type)):
        ids = [row["event_id"] for row in rows(root, table)]
        assert len(ids) == len(set(ids)) == 45, table
    assert rows(root, "quarantine") == []  # every table exists from the first batch, empty
    # The last commit of events records how far the lake has read each partition, and how
    # far the typed tables have come; no table of its own keeps it.
    from outbox_lake.offsets import Partition
    from outbox_lake.progress import latest_progress

    events = rows(root, "events")
    progress = latest_progress(DeltaTable(str(root / "events")))
    assert progress is not None and progress.typed_through is not None
    assert not (root / "_progress").exists()
    for partition in {row["partition"] for row in events}:
        last = max(row["offset"] for row in events if row["partition"] == partition)
        kept = progress.partitions[Partition(topic_for(aggregate_type), partition)]
        assert kept.end_offset == last + 1 and kept.topic_id and kept.last_record

    # The typed query's checkpoint alone deleted: it goes on from where the typed tables
    # stand (recorded in events), adding nothing twice.
    for folder in (root / "_checkpoints").iterdir():
        if folder.name.endswith("-typed"):
            shutil.rmtree(folder)
    more = [contract_record(aggregate_type, json.dumps({"n": n})) for n in range(45, 50)]
    send(bootstrap, [(r.topic, r.key, r.value, list(r.headers)) for r in more])
    ingested(env)
    for table in ("events", typed_table_name(aggregate_type)):
        ids = [row["event_id"] for row in rows(root, table)]
        assert len(ids) == len(set(ids)) == 50, table

    # Deleted in part, as a deletion under the running job leaves both checkpoints (Spark
    # wrote offsets and commits on into the folder it lost): no metadata file. Spark refuses
    # such a checkpoint; the job moves it aside and goes on from where the tables stand.
    checkpoints = sorted((root / "_checkpoints").iterdir())
    assert len(checkpoints) == 2 and all((c / "offsets").is_dir() for c in checkpoints)
    for folder in checkpoints:
        (folder / "metadata").unlink()
    last = [contract_record(aggregate_type, json.dumps({"n": n})) for n in range(50, 55)]
    send(bootstrap, [(r.topic, r.key, r.value, list(r.headers)) for r in last])
    ingested(env)
    for table in ("events", typed_table_name(aggregate_type)):
        ids = [row["event_id"] for row in rows(root, table)]
        assert len(ids) == len(set(ids)) == 55, table
    aside = [f.name for f in (root / "_checkpoints").iterdir() if ".incomplete-" in f.name]
    assert len(aside) == 2, aside


def test_typed_tables_of_types_with_alike_names_never_share_or_drop_rows(
    kafka_services: KafkaServices, tmp_path: Path
) -> None:
    prefix = f"t{uuid.uuid4().hex[:8]}"
    # (Not both 'order.v2' and 'order_v2': Apache Kafka refuses topics that differ only by
    # '.' against '_', the relay's topic registry refuses such types before.)
    types = [
        f"{prefix}Order",
        f"{prefix}order",
        f"{prefix}order.v2",
        f"{prefix}order-v2",
    ]
    records = [contract_record(t, json.dumps({"n": n, "type": t})) for t in types for n in range(3)]
    bootstrap = kafka_services.bootstrap_servers
    root = tmp_path / "lake"
    # A table already taken by another type (as two types that once mapped to one name did).
    intruder = f"{prefix}intruder"
    write_deltalake(
        str(root / typed_table_name(intruder)),
        pa.table({"event_id": ["x"], "event_date": pa.array([None], pa.date32())}),
        name="someone-else",
    )
    records += [contract_record(intruder, json.dumps({"n": 1}))]
    send(bootstrap, [(r.topic, r.key, r.value, list(r.headers)) for r in records])
    ingested(lake_env(root, prefix, bootstrap))

    names = {typed_table_name(t) for t in types}
    assert len(names) == len(types)
    for aggregate_type in types:
        typed = rows(root, typed_table_name(aggregate_type))
        assert len(typed) == 3 and {row["type"] for row in typed} == {aggregate_type}
        assert {row["aggregate_type"] for row in typed} == {aggregate_type}
        assert (
            DeltaTable(str(root / typed_table_name(aggregate_type))).metadata().name
            == aggregate_type
        )
    (refused,) = [
        q for q in rows(root, "quarantine") if q["target_table"] == typed_table_name(intruder)
    ]
    assert "holds aggregate type 'someone-else'" in refused["reason"]
    assert len(rows(root, "events")) == len(records)


@pytest.mark.parametrize(
    ("new_records", "checkpoint_has_ids"),
    [(3, True), (15, True), (15, False)],
    ids=["shorter", "longer", "longer-progress-without-ids"],
)
def test_a_recreated_topic_is_reported_and_skipped_only_when_asked(
    kafka_services: KafkaServices, tmp_path: Path, new_records: int, checkpoint_has_ids: bool
) -> None:
    """Deleted and recreated under the lake: refused, then (when asked) read from its start.
    The longer new topic holds records at every offset the lake had read: its topic id tells
    it from the old one or, where the lake's progress has no id (a broker without ids), the
    record before where the lake stands (its fingerprint). Spark's own source notices
    neither."""
    prefix = f"r{uuid.uuid4().hex[:8]}"
    aggregate_type = f"{prefix}order"
    topic = topic_for(aggregate_type)
    bootstrap = kafka_services.bootstrap_servers
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.create_topics([NewTopic(topic, 1, 1)])
        old = [contract_record(aggregate_type, json.dumps({"n": n})) for n in range(10)]
        send(bootstrap, [(r.topic, r.key, r.value, list(r.headers)) for r in old])
        root = tmp_path / "lake"
        env = lake_env(root, prefix, bootstrap)
        ingested(env)
        if not checkpoint_has_ids:
            forget_topic_ids(root)
        admin.delete_topics([topic])
        wait_until(lambda: topic not in admin.list_topics(), timeout=30, what="topic deleted")
        admin.create_topics([NewTopic(topic, 1, 1)])
    finally:
        admin.close()
    new = [
        contract_record(aggregate_type, json.dumps({"n": n})) for n in range(100, 100 + new_records)
    ]
    send(bootstrap, [(r.topic, r.key, r.value, list(r.headers)) for r in new])

    # One variant through the command (its exit status and last line), the others in-process.
    refused = refusal(env, by_command=new_records < 10)
    if checkpoint_has_ids:
        assert f"{topic}: the topic on the broker is not the one" in refused
    else:
        assert f"{topic}[0]: the record at offset 9 is not the one" in refused
    assert "recreated" in refused
    assert "OUTBOX_LAKE_FAIL_ON_DATA_LOSS=false" in refused
    assert len(rows(root, "events")) == 10  # nothing skipped silently

    ingested({**env, "OUTBOX_LAKE_FAIL_ON_DATA_LOSS": "false"})
    ids = [row["event_id"] for row in rows(root, "events")]
    assert len(ids) == len(set(ids)) == 10 + new_records
    assert {dict(r.headers)["id"].decode() for r in new} <= {str(i) for i in ids}


def test_a_replaced_topic_refilled_while_the_job_starts_over_loses_nothing(
    kafka_services: KafkaServices, tmp_path: Path
) -> None:
    """The review's case: 10 events read, the topic recreated with 3, the job (told to go
    on) killed right after it decided to read the new topic from its start, 4 more records
    while it starts again: all 17 land. The decision is made again after the kill (nothing
    recorded it before a batch of the new log landed), and the query reads the new log from
    its start instead of resuming at the old log's offset 10."""
    prefix = f"n{uuid.uuid4().hex[:8]}"
    aggregate_type = f"{prefix}order"
    topic = topic_for(aggregate_type)
    bootstrap = kafka_services.bootstrap_servers
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.create_topics([NewTopic(topic, 1, 1)])
        old = [contract_record(aggregate_type, json.dumps({"n": n})) for n in range(10)]
        send(bootstrap, [(r.topic, r.key, r.value, list(r.headers)) for r in old])
        root = tmp_path / "lake"
        env = lake_env(root, prefix, bootstrap)
        ingested(env)
        admin.delete_topics([topic])
        wait_until(lambda: topic not in admin.list_topics(), timeout=30, what="topic deleted")
        admin.create_topics([NewTopic(topic, 1, 1)])
    finally:
        admin.close()
    new = [contract_record(aggregate_type, json.dumps({"n": n})) for n in range(100, 103)]
    send(bootstrap, [(r.topic, r.key, r.value, list(r.headers)) for r in new])
    going_on = {**env, "OUTBOX_LAKE_FAIL_ON_DATA_LOSS": "false"}
    log = tmp_path / "first.log"
    with continuous_ingest(going_on, log) as job:
        wait_until(
            lambda: "was moved to" in log.read_text(errors="replace"),
            timeout=240,
            what="the job decided to read the new topic from its start",
        )
        os.killpg(job.pid, signal.SIGKILL)
        job.wait(timeout=30)
    later = [contract_record(aggregate_type, json.dumps({"n": n})) for n in range(103, 107)]
    with continuous_ingest(going_on, tmp_path / "second.log") as job:
        send(bootstrap, [(r.topic, r.key, r.value, list(r.headers)) for r in later])
        wait_until(
            lambda: (root / "events").exists() and len(rows(root, "events")) >= 17,
            timeout=240,
            what="the 7 events of the new topic landed",
        )
        os.killpg(job.pid, signal.SIGTERM)
        assert job.wait(timeout=180) == 0
    ids = [row["event_id"] for row in rows(root, "events")]
    assert len(ids) == len(set(ids)) == 17
    wanted = {dict(r.headers)["id"].decode() for r in (*old, *new, *later)}
    assert set(ids) == wanted


def test_a_topic_retired_after_the_lake_read_it_all_does_not_stop_the_lake(
    kafka_services: KafkaServices, tmp_path: Path
) -> None:
    """Deleting one aggregate type's topic once it is ingested is an operator step: the job
    goes on with the others (Spark's source would stop on the partitions it lost)."""
    prefix = f"d{uuid.uuid4().hex[:8]}"
    retired, kept = topic_for(f"{prefix}old"), topic_for(f"{prefix}new")
    bootstrap = kafka_services.bootstrap_servers
    first = [contract_record(f"{prefix}old", "{}"), contract_record(f"{prefix}new", "{}")]
    send(bootstrap, [(r.topic, r.key, r.value, list(r.headers)) for r in first])
    root = tmp_path / "lake"
    env = lake_env(root, prefix, bootstrap)
    ingested(env)
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.delete_topics([retired])
        wait_until(lambda: retired not in admin.list_topics(), timeout=30, what="topic deleted")
    finally:
        admin.close()
    later = [contract_record(f"{prefix}new", json.dumps({"n": n})) for n in range(5)]
    send(bootstrap, [(r.topic, r.key, r.value, list(r.headers)) for r in later])
    ingested(env)  # with OUTBOX_LAKE_FAIL_ON_DATA_LOSS on, as by default
    topics = [row["topic"] for row in rows(root, "events")]
    assert topics.count(kept) == 6 and topics.count(retired) == 1


def test_copies_of_an_event_id_with_other_content_are_set_aside_never_landed(
    kafka_services: KafkaServices, tmp_path: Path
) -> None:
    """Two copies of one id are duplicates only when their content is the same: a copy with
    other content (an id reused or forged) is never a duplicate, never replaces the first
    copy, and is set aside with the reason naming where the first was read; in the same
    batch and against what landed before; read again, nothing is added twice."""
    prefix = f"f{uuid.uuid4().hex[:8]}"
    aggregate_type = f"{prefix}order"
    topic = topic_for(aggregate_type)
    bootstrap = kafka_services.bootstrap_servers
    event_id = new_event_id()
    real = contract_record(aggregate_type, '{"total": 10}', event_id=event_id)
    forged = contract_record(aggregate_type, '{"total": 0}', event_id=event_id)
    other = contract_record(aggregate_type, '{"n": 1}')
    batch = [real, forged, real, other]
    sent = send(bootstrap, [(r.topic, r.key, r.value, list(r.headers)) for r in batch])
    root = tmp_path / "lake"
    env = lake_env(root, prefix, bootstrap)
    metrics = ingested(env)
    # the batch holds an id twice: the two-job path classifies its copies
    assert metrics is not None and metrics.two_job_batches._value.get() >= 1
    again = contract_record(aggregate_type, '{"total": 99}', event_id=event_id, event_type="X")
    send(bootstrap, [(again.topic, again.key, again.value, list(again.headers))])
    ingested(env)
    shutil.rmtree(root / "_checkpoints")
    ingested(env)  # everything read again

    landed = rows(root, "events")
    assert sorted(row["payload"] for row in landed) == ['{"n": 1}', '{"total": 10}']
    typed = rows(root, typed_table_name(aggregate_type))
    assert sorted(row["event_id"] for row in typed) == sorted(row["event_id"] for row in landed)
    set_aside = sorted(rows(root, "quarantine"), key=lambda row: row["offset"])
    assert [row["value"] for row in set_aside] == [b'{"total": 0}', b'{"total": 99}']
    first_at = f"{topic}[{sent[0].partition}]@{sent[0].offset}"
    for row in set_aside:
        assert row["event_id"] == str(event_id) and row["target_table"] == "events"
        assert row["reason"].startswith(f"conflicting copy: another copy of event {event_id}")
        assert first_at in row["reason"]


def test_a_copy_written_later_on_another_topic_never_replaces_the_event(
    kafka_services: KafkaServices, tmp_path: Path
) -> None:
    """Another service that learns an event id and publishes a copy of it on its own topic
    (with other content) never erases the event: the first copy is the one the database
    wrote first (the lower outbox position), even when the copy sorts first by topic and
    was read first, in the same batch."""
    prefix = f"g{uuid.uuid4().hex[:8]}"
    real_type, forger_type = f"{prefix}order", f"{prefix}aaa"
    bootstrap = kafka_services.bootstrap_servers
    event_id = new_event_id()
    real = contract_record(real_type, '{"total": 10}', event_id=event_id, position=7)
    forged = contract_record(forger_type, '{"total": 0}', event_id=event_id, position=8)
    send(bootstrap, [(r.topic, r.key, r.value, list(r.headers)) for r in (forged, real)])
    root = tmp_path / "lake"
    ingested(lake_env(root, prefix, bootstrap))

    assert [(row["topic"], row["payload"]) for row in rows(root, "events")] == [
        (topic_for(real_type), '{"total": 10}')
    ]
    assert [row["event_id"] for row in rows(root, typed_table_name(real_type))] == [str(event_id)]
    (set_aside,) = rows(root, "quarantine")
    assert set_aside["topic"] == topic_for(forger_type) and set_aside["value"] == b'{"total": 0}'
    assert set_aside["reason"].startswith("conflicting copy")


def test_a_backlog_over_many_partitions_lands_once_with_its_copies_classified(
    kafka_services: KafkaServices, tmp_path: Path
) -> None:
    """More partitions than the one-job path observes (the two-job path, every batch), a
    backlog whose batches each hold ids of its whole time (the ranges of each batch's lookup
    span the backlog, so file statistics cannot narrow it): every event lands once, a later
    copy with the same content is a duplicate, one with other content is set aside."""
    prefix = f"p{uuid.uuid4().hex[:8]}"
    aggregate_type = f"{prefix}order"
    topic = topic_for(aggregate_type)
    bootstrap = kafka_services.bootstrap_servers
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.create_topics([NewTopic(topic, num_partitions=40, replication_factor=1)])
    finally:
        admin.close()
    ids = [new_event_id() for _ in range(440)]
    backlog = [
        contract_record(aggregate_type, f'{{"n": {n}}}', event_id=ids[n], aggregate_id=str(n))
        for n in range(400)
    ]
    send(bootstrap, [(r.topic, r.key, r.value, list(r.headers)) for r in backlog])
    root = tmp_path / "lake"
    env = lake_env(root, prefix, bootstrap, OUTBOX_LAKE_MAX_RECORDS_PER_BATCH="100")
    metrics = ingested(env)
    assert metrics is not None and metrics.two_job_batches._value.get() >= 4

    # copies of landed events (the same content, so on the same partition; and another
    # content on another), beside new events
    same = contract_record(aggregate_type, '{"n": 0}', event_id=ids[0], aggregate_id="0")
    forged = contract_record(aggregate_type, '{"n": -1}', event_id=ids[1], aggregate_id="y")
    later = [
        contract_record(aggregate_type, f'{{"n": {n}}}', event_id=ids[n], aggregate_id=str(n))
        for n in range(400, 440)
    ]
    send(bootstrap, [(r.topic, r.key, r.value, list(r.headers)) for r in [same, forged, *later]])
    ingested(env)

    landed = rows(root, "events")
    assert sorted(row["event_id"] for row in landed) == sorted(str(i) for i in ids)
    assert {row["payload"] for row in landed if row["event_id"] == str(ids[1])} == {'{"n": 1}'}
    set_aside = [(row["event_id"], row["value"], row["reason"]) for row in rows(root, "quarantine")]
    assert [row[:2] for row in set_aside] == [(str(ids[1]), b'{"n": -1}')], set_aside
    assert set_aside[0][2].startswith("conflicting copy")


def forget_topic_ids(root: Path) -> None:
    """Make the lake's progress that of a broker that gives no topic ids: one more commit
    of ``events``, with no rows, whose progress has none."""
    from deltalake import CommitProperties

    from outbox_lake.offsets import Progress
    from outbox_lake.progress import LakeProgress, latest_progress
    from outbox_lake.tables import EVENTS_TABLE

    events = DeltaTable(str(root / "events"))
    progress = latest_progress(events)
    assert progress is not None and all(p.topic_id for p in progress.partitions.values())
    cleared = LakeProgress(
        {w: Progress(p.end_offset, None, p.last_record) for w, p in progress.partitions.items()},
        progress.typed_through,
    )
    write_deltalake(
        str(root / "events"),
        EVENTS_TABLE.arrow_schema().empty_table(),
        mode="append",
        commit_properties=CommitProperties(custom_metadata={"userMetadata": cleared.to_metadata()}),
    )


# -- commit order ------------------------------------------------------------------------


def test_events_are_in_commit_order_by_position_though_event_time_differs(
    relay_bench: RelayBench, tmp_path: Path
) -> None:
    """Writers build their events before their transaction takes the aggregate's row lock,
    as applications do; the lake's position order is commit order, event_time's is not."""
    prefix = f"o{uuid.uuid4().hex[:8]}"
    aggregate_type = f"{prefix}account"
    conninfo = relay_bench.database.conninfo
    with psycopg.connect(conninfo, autocommit=True) as connection:
        connection.execute(f"CREATE TABLE {prefix} (id int PRIMARY KEY, version int NOT NULL)")
        connection.execute(f"INSERT INTO {prefix} SELECT g, 0 FROM generate_series(0, 3) g")

    def write(aggregate: int, built: threading.Event | None, go: threading.Event | None) -> None:
        event = Event(aggregate_type, str(aggregate), "Moved", {"version": None})
        if built is not None:
            built.set()
        if go is not None:
            assert go.wait(30)
        with psycopg.connect(conninfo) as connection, connection.transaction():
            (version,) = connection.execute(
                f"UPDATE {prefix} SET version = version + 1 WHERE id = %s RETURNING version",
                (aggregate,),
            ).fetchone()  # type: ignore[misc]
            stamped = Event(
                event.aggregate_type,
                event.aggregate_id,
                event.event_type,
                {"version": version},
                event_id=event.event_id,
            )
            Outbox().publish(connection, stamped)

    # Deterministic inversions: the first event is built first and committed second.
    for aggregate in range(4):
        for _ in range(3):
            built, go = threading.Event(), threading.Event()
            early = threading.Thread(target=write, args=(aggregate, built, go))
            early.start()
            assert built.wait(30)
            write(aggregate, None, None)
            go.set()
            early.join(30)
    # And concurrent writers on the same aggregates.
    threads = [
        threading.Thread(target=lambda a=a: [write(a % 4, None, None) for _ in range(10)])
        for a in range(8)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    with relay_bench.in_thread():
        wait_until(lambda: relay_bench.undelivered() == 0, timeout=120, what="relayed")
    root = tmp_path / "lake"
    metrics = ingested(lake_env(root, prefix, relay_bench.kafka.bootstrap_servers))

    # every batch common (each event once, all decided): each landed in one Spark job
    assert metrics is not None and metrics.completed_batches >= 1
    assert metrics.two_job_batches._value.get() == 0
    events = rows(root, "events")
    typed = rows(root, typed_table_name(aggregate_type))
    assert len(events) == len(typed) == 4 * (6 + 20)
    for aggregate in map(str, range(4)):
        mine = [row for row in events if row["aggregate_id"] == aggregate]
        by_position = [
            json.loads(row["payload"])["version"]
            for row in sorted(mine, key=lambda r: r["position"])
        ]
        assert by_position == list(range(1, len(mine) + 1))
        by_time = [
            json.loads(row["payload"])["version"]
            for row in sorted(mine, key=lambda r: (r["event_time"], r["event_id"]))
        ]
        assert by_time != by_position, "event_time order should differ here"
        typed_mine = sorted(
            (row for row in typed if row["aggregate_id"] == aggregate), key=lambda r: r["position"]
        )
        assert [row["version"] for row in typed_mine] == by_position


# -- a clean stop ----------------------------------------------------------------------------


def test_sigterm_finishes_the_batch_exits_0_and_loses_nothing(
    kafka_services: KafkaServices, tmp_path: Path
) -> None:
    """SIGTERM to the driver only (a container runtime), then, to the job started again on the
    same lake, to its whole process group (systemd's default, Ctrl-C): Spark's JVM and Python
    workers run in a session of their own. Each run finishes its batch and exits 0; the rest
    lands once."""
    prefix = f"s{uuid.uuid4().hex[:8]}"
    aggregate_type = f"{prefix}order"
    bootstrap = kafka_services.bootstrap_servers
    records = [contract_record(aggregate_type, json.dumps({"n": n})) for n in range(20_000)]
    send(bootstrap, [(r.topic, r.key, r.value, list(r.headers)) for r in records])
    root = tmp_path / "lake"
    port = free_port()
    env = lake_env(
        root,
        prefix,
        bootstrap,
        OUTBOX_LAKE_MAX_RECORDS_PER_BATCH="500",
        OUTBOX_LAKE_METRICS_PORT=str(port),
    )

    def metrics() -> dict[str, str]:
        try:
            url = f"http://127.0.0.1:{port}/metrics"
            text = urllib.request.urlopen(url, timeout=10).read()
        except urllib.error.URLError:
            return {}  # not serving yet: the job is still starting
        return dict(
            line.rsplit(" ", 1)
            for line in text.decode().splitlines()
            if line.startswith("outbox_lake_") and " " in line
        )

    def lag() -> float:
        values = [
            float(v) for k, v in metrics().items() if k.startswith("outbox_lake_consumer_lag{")
        ]
        return sum(values) if values else -1.0

    def the_lag_gauge_goes_down() -> None:
        """Consumer lag, from the query's progress: thousands of records still to read, then
        fewer as batches land; the console's lake panel shows it per partition."""
        wait_until(lambda: lag() > 5000, timeout=60, what="the lag gauge shows the backlog")
        panel = console_lake_panel()
        lags = {f.label: f.value for f in panel.facts if f.label.startswith("lag ")}
        assert lags.keys() == {f"lag {topic_for(aggregate_type)}[0]"}, panel.facts
        assert all(value.endswith(" records") and value != "0 records" for value in lags.values())
        assert any(f.label == "last batch" and "since start" in f.value for f in panel.facts)
        assert panel.state == "warn" and "behind Kafka by" in panel.summary, panel.summary
        first = lag()
        wait_until(lambda: 0 <= lag() < first, timeout=120, what="the lag gauge goes down")

    def console_lake_panel() -> Panel:
        """What `outbox console` shows of this lake and its running job."""
        pipeline = Pipeline(
            console=ConsoleSettings(lake_metrics_url=f"http://127.0.0.1:{port}"),
            database_url="postgresql+psycopg://unused@127.0.0.1:1/unused",
            outbox=OutboxSettings(),
            connector=ConnectorSettings(),
            kafka=KafkaSettings(bootstrap_servers=bootstrap),
            lake=LakeSettings(root=str(root), topic_pattern=env["OUTBOX_LAKE_TOPIC_PATTERN"]),
        )
        return lake_panel(pipeline)

    landed_before = 0
    for run, to_the_group in enumerate((False, True)):
        log = tmp_path / f"ingest-{run}.log"
        with continuous_ingest(env, log) as job:
            # A batch is counted when it ends (its progress written), after its commits.
            wait_until(
                lambda: float(metrics().get("outbox_lake_batch_seconds_count", 0)) >= 1,
                timeout=240,
                what=f"a batch of run {run} landed and counted",
            )
            found = metrics()
            assert float(found["outbox_lake_events_total"]) >= 500
            assert 0 < float(found["outbox_lake_freshness_seconds"]) < 600
            if to_the_group:
                os.killpg(job.pid, signal.SIGTERM)
            else:
                the_lag_gauge_goes_down()
                os.kill(job.pid, signal.SIGTERM)
            assert job.wait(timeout=180) == 0, log.read_text()[-3000:]
        assert "stopped on SIGTERM" in log.read_text()
        landed = len(rows(root, "events"))
        assert landed_before < landed < 20_000, f"run {run} stopped too late to prove anything"
        landed_before = landed
    rest = lake_env(root, prefix, bootstrap, OUTBOX_LAKE_MAX_RECORDS_PER_BATCH="50000")
    ingested(rest)  # the rest, in one batch
    ids = [row["event_id"] for row in rows(root, "events")]
    assert len(ids) == len(set(ids)) == 20_000


# -- a lake of an earlier release ------------------------------------------------------------


def test_a_lake_of_the_earlier_release_continues_where_its_tables_stand(
    kafka_services: KafkaServices, tmp_path: Path
) -> None:
    """Tables written by the driver-side writer (progress as the events table's application
    transactions) and a checkpoint of our old Python source: the job moves the checkpoint
    aside and goes on from the tables' progress, not from the topic's start."""
    from deltalake import CommitProperties, Transaction

    from outbox_lake.tables import EVENTS_TABLE

    prefix = f"g{uuid.uuid4().hex[:8]}"
    aggregate_type = f"{prefix}order"
    topic = topic_for(aggregate_type)
    bootstrap = kafka_services.bootstrap_servers
    records = [contract_record(aggregate_type, json.dumps({"n": n})) for n in range(20)]
    sent = send(bootstrap, [(r.topic, r.key, r.value, list(r.headers)) for r in records])
    assert {m.partition for m in sent} == {0}
    root = tmp_path / "lake"
    # The old lake holds 5 of the first 10 events and says it has read offsets 0 to 9.
    ids = [str(uuid.UUID(dict(r.headers)["id"].decode())) for r in records]
    now = datetime.now(UTC)
    old_rows = [
        {
            "event_id": ids[n],
            "aggregate_type": aggregate_type,
            "aggregate_id": "1",
            "event_type": "Happened",
            "payload": json.dumps({"n": n}),
            "headers": "{}",
            "traceparent": "",
            "position": 1,
            "event_time": now,
            "event_date": now.date(),
            "topic": topic,
            "partition": 0,
            "offset": n,
            "ingest_time": now,
        }
        for n in range(5)
    ]
    write_deltalake(
        str(root / "events"),
        pa.Table.from_pylist(old_rows, schema=EVENTS_TABLE.arrow_schema()),
        partition_by=["event_date"],
        commit_properties=CommitProperties(
            app_transactions=[Transaction(f"outbox-lake:{topic}:0", 10)]
        ),
    )
    offsets = root / "_checkpoints" / "outbox-lake-ingest" / "offsets"
    offsets.mkdir(parents=True)
    (offsets / "0").write_text("v1\n{}\n" + json.dumps({topic: {"0": 10}}) + "\n")

    ingested(lake_env(root, prefix, bootstrap))
    landed = [row["event_id"] for row in rows(root, "events")]
    assert len(landed) == len(set(landed)) == 15
    assert set(landed) == set(ids[:5]) | set(ids[10:])
    assert list((root / "_checkpoints").glob("outbox-lake-ingest.python-source-*"))
