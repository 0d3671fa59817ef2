"""The polling relay against the real PostgreSQL and broker of the suite's stack.

The event contract it shares with CDC (exact records, rollbacks, per-aggregate order) is
checked for both paths by tests/integration/test_contract.py."""

from __future__ import annotations

import json
import uuid
from collections import defaultdict
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa

import outbox_migrations
from outbox import Event, Outbox
from outbox.core.contract import event_id_of, topic_for
from tests.cli import run_outbox
from tests.fix_relay import RelayBench, sample, wait_until
from tests.kafka_read import read_until


def fresh_type() -> str:
    return f"r{uuid.uuid4().hex[:10]}"


def write(
    connection: psycopg.Connection[Any], aggregate_type: str, aggregate_id: str, numbers: range
) -> list[uuid.UUID]:
    events = [Event(aggregate_type, aggregate_id, "Tick", {"n": n}) for n in numbers]
    with connection.transaction():
        Outbox().publish_many(connection, events)
    return [event.event_id for event in events]


def ids_of(records: list[Any]) -> list[uuid.UUID]:
    return [event_id_of(record.headers) for record in records]


def first_occurrences(records: list[Any]) -> list[Any]:
    seen: set[uuid.UUID] = set()
    firsts = []
    for record in records:
        event_id = event_id_of(record.headers)
        if event_id not in seen:
            seen.add(event_id)
            firsts.append(record)
    return firsts


def test_a_transaction_open_across_batches_is_published_in_order(
    relay_bench: RelayBench,
) -> None:
    """Its rows have the lowest positions but commit last: never skipped, order kept."""
    aggregate_type = fresh_type()
    topic = topic_for(aggregate_type)
    # A type's first publisher registers it in the topic registry and holds that row until it
    # commits: other publishers of the type would wait for the open transaction. Registered
    # beforehand, as a type that was already in use.
    engine = sa.create_engine(relay_bench.database.url)
    with engine.begin() as connection:
        outbox_migrations.register_types(connection, [aggregate_type])
    engine.dispose()
    with relay_bench.database.connect() as slow, relay_bench.database.connect() as fast:
        slow_tx = slow.transaction()
        slow_tx.__enter__()
        Outbox().publish_many(
            slow, [Event(aggregate_type, "slow", "Tick", {"n": n}) for n in range(3)]
        )
        with relay_bench.in_thread(batch_size=5) as relay:
            fast_ids = []
            for n in range(6):  # 6 commits of 5 events: several batches of the relay
                fast_ids += write(fast, aggregate_type, f"fast{n % 2}", range(n * 5, n * 5 + 5))
            wait_until(
                lambda: sample(relay, "outbox_relay_published_total") >= 30,
                timeout=60,
                what="the relay publishes the committed rows past the open transaction",
            )
            assert relay_bench.undelivered() == 0  # (the open rows are invisible)
            slow_tx.__exit__(None, None, None)  # commit: positions below all of the above
            after = write(fast, aggregate_type, "slow", range(3, 5))
            records = read_until(
                relay_bench.kafka.bootstrap_servers, topic, lambda r: len(r) >= 35, timeout=60
            )
    by_aggregate: dict[bytes, list[int]] = defaultdict(list)
    for record in first_occurrences(records):
        by_aggregate[record.key].append(json.loads(record.value)["n"])
    assert by_aggregate[b"slow"] == [0, 1, 2, 3, 4]
    assert by_aggregate[b"fast0"] == sorted(by_aggregate[b"fast0"])
    assert len(set(ids_of(records))) == 35
    assert set(fast_ids) | set(after) <= set(ids_of(records))


def test_a_poison_record_goes_to_the_dead_letters_and_the_rest_goes_on(
    relay_bench: RelayBench,
) -> None:
    aggregate_type = fresh_type()
    topic = topic_for(aggregate_type)
    with relay_bench.database.connect() as connection, connection.transaction():
        events = [
            Event(aggregate_type, "1", "Small", {"n": 1}),
            Event(aggregate_type, "2", "Huge", {"blob": "x" * 20_000}),
            Event(aggregate_type, "3", "Small", {"n": 3}),
        ]
        Outbox().publish_many(connection, events)
    with relay_bench.in_thread(max_request_bytes=4096) as relay:
        records = read_until(
            relay_bench.kafka.bootstrap_servers, topic, lambda r: len(r) >= 2, timeout=60
        )
        wait_until(lambda: relay_bench.undelivered() == 0, timeout=30, what="outbox drained")
        assert sample(relay, "outbox_relay_dead_lettered_total") == 1
    assert sorted(ids_of(records)) == sorted([events[0].event_id, events[2].event_id])
    env = {"OUTBOX_DATABASE_URL": relay_bench.database.url}
    listed = run_outbox("relay", "dead-letters", "list", "--json", env=env)
    assert listed.returncode == 0, listed.stderr
    (letter,) = json.loads(listed.stdout)
    assert letter["event_id"] == str(events[1].event_id)
    assert "MessageSizeTooLarge" in letter["reason"]
    shown = run_outbox("relay", "dead-letters", "list", env=env)
    assert str(events[1].event_id) in shown.stdout and "1 dead letter(s)" in shown.stderr
    # Fixed (a larger limit), replayed: published with its original id.
    retried = run_outbox("relay", "dead-letters", "retry", str(events[1].event_id), env=env)
    assert retried.returncode == 0, retried.stderr
    assert "1 dead letter(s) back in the outbox" in retried.stdout
    with relay_bench.in_thread(max_request_bytes=1_048_576):
        records = read_until(
            relay_bench.kafka.bootstrap_servers, topic, lambda r: len(r) >= 3, timeout=60
        )
    assert sorted(ids_of(records)) == sorted(event.event_id for event in events)
    assert run_outbox("relay", "dead-letters", "list", env=env).stdout.strip() == ""


def test_kill_9_mid_batch_then_restart_loses_nothing(relay_bench: RelayBench) -> None:
    aggregate_type = fresh_type()
    expected: list[uuid.UUID] = []
    with relay_bench.database.connect() as connection:
        for chunk in range(10):
            numbers = range(chunk * 500, chunk * 500 + 500)
            expected += write(connection, aggregate_type, str(chunk % 5), numbers)
    first = relay_bench.process(OUTBOX_RELAY_BATCH_SIZE="500")
    wait_until(
        lambda: first.metric("outbox_relay_published_total") > 0,
        timeout=60,
        what="the first relay publishes",
    )
    first.kill()
    assert relay_bench.undelivered() > 0, "killed too late: nothing left to prove"
    second = relay_bench.process(OUTBOX_RELAY_BATCH_SIZE="500")
    wait_until(lambda: relay_bench.undelivered() == 0, timeout=120, what="outbox drained")
    records = read_until(
        relay_bench.kafka.bootstrap_servers,
        topic_for(aggregate_type),
        lambda r: set(ids_of(r)) >= set(expected),
        timeout=60,
    )
    assert set(ids_of(records)) == set(expected)
    assert second.terminate() == 0


def test_sigterm_drains_the_batch_and_exits_0_with_health_probes(relay_bench: RelayBench) -> None:
    aggregate_type = fresh_type()
    with relay_bench.database.connect() as connection:
        expected = write(connection, aggregate_type, "1", range(3000))
    relay = relay_bench.process(OUTBOX_RELAY_BATCH_SIZE="200")
    wait_until(lambda: relay.probe("/readyz") == 200, timeout=60, what="ready")
    assert relay.probe("/healthz") == 200
    assert relay.probe("/nothing") == 404
    wait_until(
        lambda: relay.metric("outbox_relay_published_total") >= 200, timeout=60, what="publishing"
    )
    assert relay.metric("outbox_relay_leader") == 1
    assert relay.metric('outbox_relay_mode{mode="polling"}') == 1
    assert relay.terminate() == 0
    log = relay.log.read_text()
    assert '"message": "relay stopped"' in log
    assert relay_bench.database.url.split("@")[0].split(":")[-1] not in log  # no password
    # What it published is gone from the outbox; the rest waits; nothing half-done.
    left = relay_bench.undelivered()
    records = read_until(
        relay_bench.kafka.bootstrap_servers,
        topic_for(aggregate_type),
        lambda r: len(r) >= len(expected) - left,
        timeout=30,
    )
    assert len(set(ids_of(records))) == len(expected) - left
    assert ids_of(records) == expected[: len(records)]


def test_the_relay_runs_with_its_least_privileged_role(relay_bench: RelayBench) -> None:
    role = f"relay_{uuid.uuid4().hex[:8]}"
    env = {
        "OUTBOX_DATABASE_URL": relay_bench.database.url,
        "OUTBOX_RELAY_DATABASE_PASSWORD": "relay-secret-42",
    }
    created = run_outbox("db", "relay-role", role, env=env)
    assert created.returncode == 0, created.stderr
    assert "relay-secret-42" not in created.stdout + created.stderr
    cluster = relay_bench.database.cluster
    url = (
        f"postgresql+psycopg://{role}:relay-secret-42@127.0.0.1:{cluster.port}/"
        f"{relay_bench.database.name}"
    )
    aggregate_type = fresh_type()
    with relay_bench.database.connect() as connection:
        expected = write(connection, aggregate_type, "1", range(50))
    relay = relay_bench.process(OUTBOX_DATABASE_URL=url)
    wait_until(lambda: relay_bench.undelivered() == 0, timeout=60, what="relayed by the role")
    assert (
        run_outbox("relay", "health", env={"OUTBOX_RELAY_HTTP_PORT": str(relay.port)}).returncode
        == 0
    )
    records = read_until(
        relay_bench.kafka.bootstrap_servers, topic_for(aggregate_type), lambda r: len(r) >= 50
    )
    assert set(ids_of(records)) == set(expected)
    assert relay.terminate() == 0
    as_role = psycopg.conninfo.make_conninfo(
        relay_bench.database.conninfo, user=role, password="relay-secret-42"
    )
    for forbidden in (
        "UPDATE outbox.outbox SET type = 'x'",
        "SELECT * FROM outbox.outbox_inbox",
        "CREATE TABLE outbox.sneaky (x int)",
        "TRUNCATE outbox.outbox",
    ):
        with psycopg.connect(as_role) as connection:
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                connection.execute(forbidden)
