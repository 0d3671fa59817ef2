"""Everything that grows is bounded: delivered rows in a CDC-only deployment, expired dedup
keys, inbox claims, dead letters and heartbeat rows; an idle relay consumes no xids."""

from __future__ import annotations

import time
import uuid

import pytest
import sqlalchemy as sa

import outbox_migrations
from outbox import Event, Outbox
from outbox.core.contract import event_id_of, topic_for
from tests.cli import run_outbox
from tests.fix_cdc import cdc_path_for
from tests.fix_postgres import ScratchDatabase
from tests.fix_relay import RelayBench, sample, wait_until
from tests.kafka_read import read_until

pytestmark = pytest.mark.timeout(240)


def test_cleanup_mode_bounds_a_cdc_only_outbox(relay_bench: RelayBench) -> None:
    """CDC delivers; the relay in cleanup mode deletes the delivered rows, publishes nothing."""
    with cdc_path_for(relay_bench.kafka, relay_bench.database) as cdc:
        aggregate_type = f"g{uuid.uuid4().hex[:10]}"
        events = [Event(aggregate_type, str(n % 4), "Tick", {"n": n}) for n in range(40)]
        with relay_bench.database.connect() as connection, connection.transaction():
            Outbox().publish_many(connection, events)
        prefix = cdc.connector.topic_prefix
        with relay_bench.in_thread(mode="cleanup", cdc_topic_prefix=prefix) as relay:
            wait_until(lambda: relay_bench.undelivered() == 0, timeout=90, what="cleaned up")
            assert sample(relay, "outbox_relay_cdc_confirmed_total") >= 40
            assert sample(relay, "outbox_relay_published_total") == 0
            assert sample(relay, "outbox_relay_takeovers_total") == 0
            assert sample(relay, "outbox_relay_mode", mode="cleanup") == 1
        records = read_until(
            relay_bench.kafka.bootstrap_servers, topic_for(aggregate_type), lambda r: len(r) >= 40
        )
        assert {event_id_of(r.headers) for r in records} == {e.event_id for e in events}


def test_cleanup_mode_never_publishes_even_when_cdc_is_silent(relay_bench: RelayBench) -> None:
    """No connector at all: the rows stay (CDC's to deliver), the relay only stands by."""
    aggregate_type = f"s{uuid.uuid4().hex[:10]}"
    with relay_bench.database.connect() as connection, connection.transaction():
        Outbox().publish(connection, Event(aggregate_type, "1", "Tick", {}))
    with relay_bench.in_thread(mode="cleanup", grace_seconds=0.5) as relay:
        wait_until(
            lambda: relay.liveness.state == "leader: cleaning up what CDC delivered (cleanup mode)",
            timeout=60,
            what="standing by",
        )
        time.sleep(1.5)  # three grace periods: auto mode would have taken over by now
        assert sample(relay, "outbox_relay_published_total") == 0
    assert relay_bench.undelivered() == 1


def test_expired_rows_are_deleted_and_live_ones_kept(empty_database: ScratchDatabase) -> None:
    engine = sa.create_engine(empty_database.url)
    with engine.begin() as connection:
        outbox_migrations.upgrade(connection)
    engine.dispose()
    with empty_database.connect() as connection:
        for age in ("2 days", "1 minute"):  # dedup window 24 h, inbox 7 days, letters 30 days
            connection.execute(
                "INSERT INTO outbox.outbox_dedup (dedup_key, event_id, created_at) "
                "VALUES (%s, gen_random_uuid(), now() - %s::interval)",
                (f"k-{age}", age),
            )
        for age in ("8 days", "1 day"):
            connection.execute(
                "INSERT INTO outbox.outbox_inbox (consumer, message_id, received_at) "
                "VALUES ('c', %s, now() - %s::interval)",
                (f"m-{age}", age),
            )
        for n, age in enumerate(("31 days", "29 days")):
            connection.execute(
                "INSERT INTO outbox.outbox_dead_letter (id, aggregatetype, aggregateid, type, "
                "payload, headers, traceparent, position, created_at, reason, failed_at) VALUES "
                "(gen_random_uuid(), 'a', '1', 'T', '{}', '{}', '', %s, now(), 'r', "
                "now() - %s::interval)",
                (n, age),
            )
            connection.execute(
                "INSERT INTO outbox.outbox_inbox_dead_letter (consumer, topic, partition, "
                '"offset", headers, reason, attempts, failed_at) VALUES '
                "('c', 't', 0, %s, '[]', 'r', 1, now() - %s::interval)",
                (n, age),
            )
        for age in ("2 hours", "1 minute"):
            connection.execute(
                "INSERT INTO outbox.outbox_heartbeat (beat) VALUES (now() - %s::interval)", (age,)
            )
        # effect steps: done 31 days ago goes; done 8 days ago stays (as long as dead letters
        # do), and so do one done long ago whose event has a dead letter and a parked one
        for n, (state, age) in enumerate(
            (
                ("done", "31 days"),
                ("done", "8 days"),
                ("done", "40 days"),
                ("needs_decision", "40 days"),
            )
        ):
            connection.execute(
                "INSERT INTO outbox.outbox_inbox_effect (consumer, event_id, effect, "
                "idempotency_key, state, attempt, context, started_at, updated_at) VALUES "
                "('c', %s, 'charge', gen_random_uuid(), %s, 1, '{}', now() - %s::interval, "
                "now() - %s::interval)",
                (f"e{n}", state, age, age),
            )
        connection.execute(
            "INSERT INTO outbox.outbox_inbox_dead_letter (consumer, topic, partition, "
            '"offset", event_id, headers, reason, attempts, failed_at) VALUES '
            "('c', 't', 0, 9, 'e2', '[]', 'r', 1, now() - interval '1 day')"
        )
        connection.commit()
    result = run_outbox("db", "expire", env={"OUTBOX_DATABASE_URL": empty_database.url})
    assert result.returncode == 0, result.stderr
    for table in (
        "outbox_dedup",
        "outbox_inbox",
        "outbox_inbox_dead_letter",
        "outbox_heartbeat",
        "outbox_inbox_effect",
    ):
        assert f"{table}: 1 expired row(s) deleted" in result.stdout
        with empty_database.connect() as connection:
            left = connection.execute(f"SELECT count(*) FROM outbox.{table}").fetchone()
        kept = {"outbox_inbox_effect": 3, "outbox_inbox_dead_letter": 2}.get(table, 1)
        assert left == (kept,), f"{table}: the live rows must stay"
    with empty_database.connect() as connection:
        left = connection.execute("SELECT count(*) FROM outbox.outbox_dead_letter").fetchone()
    assert left == (2,), "the relay's dead letters (events never published) stay"


def test_relay_dead_letters_stay_until_replayed_or_discarded(
    empty_database: ScratchDatabase,
) -> None:
    """A relay dead letter is a committed event that was never published: no retention
    deletes it; an operator replays it or discards it by its id, saying --yes."""
    engine = sa.create_engine(empty_database.url)
    with engine.begin() as connection:
        outbox_migrations.upgrade(connection)
    engine.dispose()
    env = {"OUTBOX_DATABASE_URL": empty_database.url}
    ids = [uuid.uuid4() for _ in range(3)]
    with empty_database.connect() as connection:
        for n, event_id in enumerate(ids):
            connection.execute(
                "INSERT INTO outbox.outbox_dead_letter (id, aggregatetype, aggregateid, type, "
                "payload, headers, traceparent, position, created_at, reason, failed_at) VALUES "
                "(%s, 'a', '1', 'T', '{}', '{}', '', %s, now(), 'too large', "
                "now() - interval '400 days')",
                (event_id, n),
            )
        connection.commit()

    def letters() -> set[uuid.UUID]:
        with empty_database.connect() as connection:
            return {r[0] for r in connection.execute("SELECT id FROM outbox.outbox_dead_letter")}

    expired = run_outbox("db", "expire", "--dead-letters-days", "1", env=env)
    assert expired.returncode == 0, expired.stderr
    assert letters() == set(ids)
    unsure = run_outbox("relay", "dead-letters", "discard", str(ids[0]), env=env)
    assert unsure.returncode == 2 and "--yes" in unsure.stderr, unsure.stderr
    assert letters() == set(ids)
    unknown = uuid.uuid4()
    discarded = run_outbox(
        "relay",
        "dead-letters",
        "discard",
        str(ids[0]),
        str(ids[1]),
        str(unknown),
        "--yes",
        env=env,
    )
    assert "2 dead letter(s) discarded" in discarded.stdout, discarded.stderr
    assert discarded.returncode == 2 and str(unknown) in discarded.stderr
    assert letters() == {ids[2]}


def test_an_idle_relay_consumes_no_transaction_ids_and_reports_table_sizes(
    relay_bench: RelayBench,
) -> None:
    with relay_bench.database.connect() as connection:
        connection.execute("ANALYZE")
        connection.commit()
    with relay_bench.in_thread(idle_seconds=0.02) as relay:
        wait_until(lambda: sample(relay, "outbox_relay_leader") == 1, timeout=30, what="leads")

        def current_xid() -> int:
            with relay_bench.database.connect() as connection:
                row = connection.execute("SELECT pg_current_xact_id()::text::bigint").fetchone()
            assert row is not None
            return int(row[0])

        before = current_xid()
        time.sleep(2)  # about 100 idle cycles: the measure itself, not a wait for a condition
        used = current_xid() - before
        wait_until(
            lambda: (
                relay.metrics.registry.get_sample_value(
                    "outbox_table_rows_estimate", {"table": "outbox_dedup"}
                )
                is not None
            ),
            timeout=10,
            what="table sizes reported",
        )
    # Transaction ids are the cluster's: this worker's other databases use some meanwhile (a
    # CDC connector's heartbeat every second, autovacuum's analyze), and the relay renews its
    # leases every third of the lease (one id each). An id per idle cycle would be ~100.
    assert used <= 10, f"an idle relay consumed {used} transaction ids in 2 s"
