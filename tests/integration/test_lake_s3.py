"""The lake on S3-compatible object storage: the job, its readers and its writers on an
``s3://`` root of the suite's SeaweedFS (tests/fix_object_store.py), the events from the
suite's PostgreSQL and Kafka. Read back with ``deltalake``, never with Spark."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import signal
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pytest
from kafka import KafkaProducer

from outbox import Event, Outbox
from outbox.core.contract import topic_for
from outbox_stack.object_store import BUCKET
from tests.cli import run_outbox
from tests.fix_lake import continuous_ingest, ingested_by_command, lake_env
from tests.fix_object_store import ObjectStore
from tests.fix_postgres import ROOT
from tests.fix_relay import RelayBench, wait_until
from tests.kafka_read import read_until

pytestmark = pytest.mark.timeout(900)


def s3_env(store: ObjectStore, root: str, prefix: str, bench: RelayBench, **extra: str) -> dict:
    return {
        **store.env,
        **lake_env(root, prefix, bench.kafka.bootstrap_servers),
        "OUTBOX_DATABASE_URL": bench.database.url,
        **extra,
    }


def ingested(env: dict[str, str]) -> None:
    """``outbox lake ingest --available-now`` on S3 (a process of its own: the credentials
    are its environment's), which must succeed and never show the secret key."""
    done = ingested_by_command(env)
    assert env["AWS_SECRET_ACCESS_KEY"] not in done.stdout + done.stderr


def command_lines(pid: int) -> list[str]:
    """The command lines of ``pid`` and its descendants (the driver, Spark's JVM)."""
    from tests.integration.test_loopback import with_descendants

    found = []
    for member in with_descendants(pid):
        try:
            found.append(Path(f"/proc/{member}/cmdline").read_bytes().decode(errors="replace"))
        except OSError:
            continue  # ended meanwhile
    return found


def publish_and_relay(bench: RelayBench, events: list[Event]) -> None:
    with bench.database.connect() as connection, connection.transaction():
        Outbox().publish_many(connection, events)
    with bench.in_thread():
        wait_until(lambda: bench.undelivered() == 0, timeout=120, what="relayed")


def test_a_job_killed_mid_batch_on_s3_loses_and_duplicates_nothing_and_every_reader_reads_it(
    relay_bench: RelayBench, object_store: ObjectStore, tmp_path: Path
) -> None:
    """One backlog through two runs of the job on S3: the first killed (``kill -9``) after
    its second batch, the second from the checkpoint on S3 after the same records arrived
    again through another path. Then every reader of the lake reads it there."""
    prefix = f"s{uuid.uuid4().hex[:8]}"
    tick, order, payment = f"{prefix}a", f"{prefix}order", f"{prefix}payment"
    committed = (
        [Event(tick, str(n % 20), "Tick", {"n": n}) for n in range(3000)]
        + [
            Event(order, str(n % 4), "OrderPlaced", {"total": n * 1.5, "customer": f"c{n}"})
            for n in range(30)
        ]
        + [Event(payment, str(n), "PaymentTaken", {"amount": n}) for n in range(6)]
    )
    publish_and_relay(relay_bench, committed)
    root = object_store.new_root()
    env = s3_env(object_store, root, prefix, relay_bench, OUTBOX_LAKE_MAX_RECORDS_PER_BATCH="500")
    expected = sorted(str(e.event_id) for e in committed)
    from deltalake import DeltaTable

    def batches_landed() -> int:
        if not object_store.has_table(root, "events"):
            return 0
        return int(
            DeltaTable(f"{root}/events", storage_options=object_store.storage_options).version()
        )

    log = tmp_path / "ingest.log"
    with continuous_ingest(env, log) as job:
        # Version 0 creates the table; each batch then merges once.
        wait_until(lambda: batches_landed() >= 2, timeout=400, what="two batches on S3")
        lines = command_lines(job.pid)
        assert any("SparkSubmit" in line for line in lines), "Spark's JVM not found"
        assert not any(env["AWS_SECRET_ACCESS_KEY"] in line for line in lines)
        os.killpg(job.pid, signal.SIGKILL)  # mid-batch: the next one is under way
        job.wait(timeout=30)
    assert env["AWS_SECRET_ACCESS_KEY"] not in log.read_text(errors="replace")
    landed = len(object_store.rows(root, "events"))
    assert 0 < landed < len(committed), f"killed too late to prove anything ({landed} landed)"

    # The orders again through another path (copies at new offsets, some of events that
    # landed before the kill, some not yet): the lake adds nothing.
    records = read_until(
        relay_bench.kafka.bootstrap_servers, topic_for(order), lambda r: len(r) >= 30
    )
    producer = KafkaProducer(bootstrap_servers=relay_bench.kafka.bootstrap_servers)
    for record in records:
        producer.send(
            record.topic, key=record.key, value=record.value, headers=list(record.headers)
        )
    producer.flush()
    producer.close()

    # Restarted from the checkpoint on S3: Spark replays the interrupted batch with its logged
    # offsets, then takes the rest in one batch (fewer batches: a shorter test).
    ingested({**env, "OUTBOX_LAKE_MAX_RECORDS_PER_BATCH": "10000"})
    ids = [r["event_id"] for r in object_store.rows(root, "events")]
    assert len(ids) == len(set(ids)), "an event landed twice"
    assert sorted(ids) == expected, "events lost"
    assert len(object_store.rows(root, f"aggregate_{order}")) == 30
    from outbox_lake.progress import latest_progress

    events = DeltaTable(f"{root}/events", storage_options=object_store.storage_options)
    progress = latest_progress(events)  # in the events table's own commits
    assert progress and all(p.end_offset > 0 for p in progress.partitions.values())

    listed = run_outbox("lake", "tables", "--json", env=env)
    assert listed.returncode == 0, listed.stderr
    found = json.loads(listed.stdout)
    assert found["freshness"]["line"].startswith("freshness: last commit "), listed.stdout
    names = [table["name"] for table in found["tables"]]
    assert names == [f"aggregate_{t}" for t in (tick, order, payment)] + ["events", "quarantine"], (
        names
    )
    shown = run_outbox("lake", "tables", env=env)  # for people: a table, then the freshness
    assert all(name in shown.stdout for name in names), shown.stdout
    assert shown.stdout.splitlines()[-1].startswith("freshness: last commit "), shown.stdout
    answer = run_outbox("lake", "query", "--format", "csv", "SELECT count(*) FROM events", env=env)
    assert answer.returncode == 0, answer.stderr
    assert answer.stdout.splitlines()[1] == str(len(committed)), answer.stdout

    reconciled = run_outbox("reconcile", "--json", "--quiet", env=env, timeout=300)
    assert reconciled.returncode == 0, reconciled.stdout[-3000:] + reconciled.stderr[-3000:]
    assert json.loads(reconciled.stdout)["findings"] == []
    event_id = str(committed[-1].event_id)
    traced = run_outbox("trace", "--json", event_id, env=env, timeout=300)
    assert traced.returncode == 0, traced.stderr
    lineage = json.loads(traced.stdout)
    (row,) = lineage["lake"]
    assert row["delta_version"] >= 1 and lineage["typed"]["present"] is True
    assert [c["offset"] for c in lineage["kafka"]] == [row["offset"]]

    # Maintenance: refused while the job may run, done when told it is stopped.
    refused = run_outbox("lake", "maintain", env=env)
    assert refused.returncode == 2 and "--ingest-stopped" in refused.stderr, refused.stderr
    maintained = run_outbox("lake", "maintain", "--ingest-stopped", env=env, timeout=300)
    assert maintained.returncode == 0, maintained.stderr
    compacted = re.search(r"^events\s+compacted (\d+) files into (\d+)", maintained.stdout, re.M)
    assert compacted is not None and int(compacted[1]) > int(compacted[2]), maintained.stdout
    assert sorted(r["event_id"] for r in object_store.rows(root, "events")) == expected


def test_a_wrong_secret_key_is_refused_in_seconds_naming_the_variable(
    relay_bench: RelayBench, object_store: ObjectStore
) -> None:
    root = object_store.new_root()
    env = s3_env(object_store, root, "w", relay_bench, AWS_SECRET_ACCESS_KEY="not-the-key")
    for command in (
        ("lake", "ingest", "--available-now"),
        ("lake", "tables"),
        ("lake", "query", "SELECT 1"),
        ("lake", "maintain", "--ingest-stopped"),
    ):
        started = time.monotonic()
        done = run_outbox(*command, env=env, timeout=120)
        took = time.monotonic() - started
        assert done.returncode == 2, (command, done.stdout, done.stderr[-2000:])
        assert "AWS_SECRET_ACCESS_KEY" in done.stderr, (command, done.stderr[-2000:])
        assert "not-the-key" not in done.stderr + done.stdout
        assert took < 60, f"{command}: {took:.1f} s"
    unknown = run_outbox("lake", "tables", env={**env, "AWS_ACCESS_KEY_ID": "nobody"})
    assert unknown.returncode == 2 and "AWS_ACCESS_KEY_ID" in unknown.stderr, unknown.stderr


def signed_put(store: ObjectStore, key: str, body: bytes, **headers: str) -> int:
    """One PutObject signed with AWS Signature V4 (what every S3 client sends), by hand: the
    HTTP status."""
    env = store.env
    endpoint = env["AWS_ENDPOINT_URL"]
    now = datetime.now(UTC)
    stamp, day = now.strftime("%Y%m%dT%H%M%SZ"), now.strftime("%Y%m%d")
    digest = hashlib.sha256(body).hexdigest()
    path = f"/{BUCKET}/{urllib.parse.quote(key)}"
    signed = {
        "host": urllib.parse.urlsplit(endpoint).netloc,
        "x-amz-content-sha256": digest,
        "x-amz-date": stamp,
        **{name.lower(): value for name, value in headers.items()},
    }
    names = ";".join(sorted(signed))
    canonical = "\n".join(
        ["PUT", path, "", *(f"{n}:{signed[n]}" for n in sorted(signed)), "", names, digest]
    )
    scope = f"{day}/{env['AWS_REGION']}/s3/aws4_request"
    to_sign = "\n".join(
        ["AWS4-HMAC-SHA256", stamp, scope, hashlib.sha256(canonical.encode()).hexdigest()]
    )
    key_ = ("AWS4" + env["AWS_SECRET_ACCESS_KEY"]).encode()
    for part in (day, env["AWS_REGION"], "s3", "aws4_request"):
        key_ = hmac.new(key_, part.encode(), hashlib.sha256).digest()
    signature = hmac.new(key_, to_sign.encode(), hashlib.sha256).hexdigest()
    authorization = (
        f"AWS4-HMAC-SHA256 Credential={env['AWS_ACCESS_KEY_ID']}/{scope}, "
        f"SignedHeaders={names}, Signature={signature}"
    )
    request = urllib.request.Request(
        endpoint + path,
        data=body,
        method="PUT",
        headers={
            **{n: v for n, v in signed.items() if n != "host"},
            "Authorization": authorization,
        },
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as refused:
        return int(refused.code)


def test_the_store_refuses_a_second_commit_of_one_version_and_deltalake_retries(
    object_store: ObjectStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What makes ``deltalake``'s commits safe on S3 (the first version of each table,
    ``_progress``, ``maintain``): a conditional write (``If-None-Match: *``) of an object that
    exists is refused, and the writer that lost the race commits the next version instead of
    overwriting. AWS_S3_ALLOW_UNSAFE_RENAME in the environment changes nothing."""
    from deltalake import DeltaTable, write_deltalake

    from outbox_lake.settings import LakeSettings
    from outbox_lake.storage import storage_options

    key = f"test-{uuid.uuid4().hex[:10]}/_delta_log/00000000000000000001.json"
    assert signed_put(object_store, key, b"first", **{"If-None-Match": "*"}) == 200
    assert signed_put(object_store, key, b"second", **{"If-None-Match": "*"}) == 412
    assert signed_put(object_store, key, b"blind") == 200  # what an unconditional commit does

    for name, value in object_store.env.items():
        if not name.startswith("OUTBOX_"):
            monkeypatch.setenv(name, value)
    monkeypatch.setenv("AWS_S3_ALLOW_UNSAFE_RENAME", "true")
    root = object_store.new_root()
    options = storage_options(LakeSettings(root=root, s3_path_style=True))
    uri = f"{root}/appends"
    write_deltalake(uri, pa.table({"n": [0]}), storage_options=options)
    stale = DeltaTable(uri, storage_options=options)  # sees version 0 only
    write_deltalake(uri, pa.table({"n": [1]}), mode="append", storage_options=options)
    write_deltalake(stale, pa.table({"n": [2]}), mode="append")  # tries version 1 first
    assert DeltaTable(uri, storage_options=options).version() == 2
    assert sorted(r["n"] for r in object_store.rows(root, "appends")) == [0, 1, 2]


def test_the_stack_s_object_store_is_opt_in_on_loopback_with_private_keys(
    tmp_path: Path,
) -> None:
    """``OUTBOX_STACK_OBJECT_STORE=true``: SeaweedFS in the stack, every listener on
    loopback, its keys 0600, and ``stack env``'s lake variables pointing at it."""
    from outbox.settings import KafkaSettings
    from outbox_stack.local import LocalStack
    from outbox_stack.settings import StackSettings
    from tests.fix_object_store import free_object_store_port
    from tests.integration.test_loopback import is_loopback, listening_on, with_descendants

    settings = StackSettings(
        dir=tmp_path / "stack",
        object_store=True,
        object_store_port=free_object_store_port(),
        downloads=ROOT / ".cache" / "stack",
    )
    stack = LocalStack(settings, KafkaSettings())
    assert LocalStack(settings.model_copy(update={"object_store": False})).object_store is None
    store = stack.object_store
    assert store is not None
    store.up()
    try:
        pid = store.process.pid()
        assert pid is not None
        found = listening_on(with_descendants(pid))
        assert len(found) >= 10 and all(is_loopback(address) for address, _ in found), found
        for name in ("s3-access-key", "s3-secret-key"):
            assert (store.process.home / name).stat().st_mode & 0o777 == 0o600
        (line,) = [line for line in stack.status() if line.name == "s3"]
        assert line.running and store.endpoint in line.address
        env = store.client_environment()
        assert env["AWS_ENDPOINT_URL"] == store.endpoint and env["AWS_ALLOW_HTTP"] == "true"
        listed = run_outbox("lake", "tables", env={**env, "OUTBOX_LAKE_ROOT": store.lake_root})
        assert listed.returncode == 0, listed.stderr
        # An empty lake lists no table, only that nothing has landed yet.
        assert listed.stdout.splitlines() == [
            "freshness: last commit never, newest event never; "
            "lag behind Kafka unknown (no events table yet)"
        ], listed.stdout
    finally:
        stack.down()
    assert not store.process.is_running()
