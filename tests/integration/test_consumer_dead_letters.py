"""``outbox consumer dead-letters list|show|replay|discard`` against PostgreSQL and Kafka, as
operators run it: dead letters an ``IdempotentConsumer`` made with a failing handler are
listed and shown; a replay puts the record back on its topic byte for byte, the dead letter
goes, the fixed consumer handles it once and another consumer skips it (its inbox); a record
not kept as delivered is refused; discard asks for --yes; a consumer role sees, replays and
discards only its own consumer names' dead letters."""

from __future__ import annotations

import json
import secrets
import uuid
from typing import Any

import psycopg
import sqlalchemy as sa
from kafka import KafkaProducer

from outbox import Event, Outbox
from outbox.consumer import IdempotentConsumer, ReceivedEvent
from outbox.core.contract import topic_for
from outbox.core.kafka_record import KafkaRecord
from tests.cli import run_outbox
from tests.fix_postgres import ScratchDatabase
from tests.fix_relay import RelayBench, wait_until
from tests.kafka_read import read_until

FAST_GROUP = {
    "session_timeout_ms": 6000,
    "heartbeat_interval_ms": 1000,
    "max_poll_interval_ms": 6000,
}


def drain(consumer: IdempotentConsumer[Any], until: Any, what: str) -> None:
    wait_until(
        lambda: consumer.poll_once(timeout_seconds=0.5) >= 0 and until(), timeout=90, what=what
    )


def make_consumer(
    bench: RelayBench, engine: sa.Engine, name: str, topic: str, handler: Any
) -> IdempotentConsumer[Any]:
    return IdempotentConsumer(
        name=name,
        group_id=f"{name}-{uuid.uuid4().hex[:6]}",
        topics=[topic],
        bootstrap_servers=bench.kafka.bootstrap_servers,
        begin=engine.begin,
        handler=handler,
        max_attempts=2,
        retry_backoff_seconds=0.05,
        consumer_options=FAST_GROUP,
    )


def place_of(record: KafkaRecord) -> list[str]:
    return [record.topic, str(record.partition), str(record.offset)]


def test_list_show_replay_and_discard_a_consumers_dead_letters(relay_bench: RelayBench) -> None:
    aggregate_type = f"dl{uuid.uuid4().hex[:8]}"
    topic = topic_for(aggregate_type)
    bootstrap = relay_bench.kafka.bootstrap_servers
    env = {
        "OUTBOX_DATABASE_URL": relay_bench.database.url,
        "OUTBOX_KAFKA_BOOTSTRAP_SERVERS": bootstrap,
    }
    with relay_bench.database.connect() as connection, connection.transaction():
        events = [Event(aggregate_type, "1", "Step", {"n": n}) for n in range(3)]
        Outbox().publish_many(connection, events)
    with relay_bench.in_thread():
        wait_until(lambda: relay_bench.undelivered() == 0, timeout=60, what="relayed")
    # Not an outbox record (no id), and a header value that is not UTF-8: kept as U+FFFD.
    producer = KafkaProducer(bootstrap_servers=bootstrap)
    producer.send(topic, key=b"1", value=b"raw", headers=[("eventType", b"\xffX")])
    producer.flush()
    producer.close()
    originals = read_until(bootstrap, topic, lambda r: len(r) >= 4, timeout=60)
    failing = originals[1]  # the second event's record

    engine = sa.create_engine(relay_bench.database.url)
    with engine.begin() as connection:
        connection.exec_driver_sql("CREATE TABLE applied (consumer text, n int)")
    broken = {"shipping": True}

    def handler_of(name: str) -> Any:
        def handle(connection: sa.Connection, event: ReceivedEvent) -> None:
            if broken.get(name) and event.payload["n"] == 1:
                raise RuntimeError("the handler cannot take n=1 yet")
            connection.execute(
                sa.text("INSERT INTO applied VALUES (:c, :n)"), {"c": name, "n": event.payload["n"]}
            )

        return handle

    shipping = make_consumer(relay_bench, engine, "shipping", topic, handler_of("shipping"))
    billing = make_consumer(relay_bench, engine, "billing", topic, handler_of("billing"))
    try:
        drain(shipping, lambda: shipping.stats.dead_lettered == 2, "shipping dead-letters two")
        drain(
            billing,
            lambda: billing.stats.applied == 3 and billing.stats.dead_lettered == 1,
            "billing handles the three events, dead-letters the raw record",
        )
        assert shipping.stats.applied == 2

        listed = run_outbox(
            "consumer", "dead-letters", "list", "--consumer", "shipping", "--json", env=env
        )
        assert listed.returncode == 0, listed.stderr
        letters = json.loads(listed.stdout)
        assert len(letters) == 2 and "2 dead letter(s)" in listed.stderr
        first = next(one for one in letters if one["event_id"] == str(events[1].event_id))
        where = [first["topic"], str(first["partition"]), str(first["offset"])]
        assert first["consumer"] == "shipping" and where == place_of(failing)
        assert first["attempts"] == 2 and first["value_bytes"] == len(failing.value or b"")
        assert first["reason"].endswith("RuntimeError: the handler cannot take n=1 yet")
        raw = next(one for one in letters if one["event_id"] is None)
        assert (raw["topic"], raw["partition"], raw["offset"]) == (topic, 0, 3)
        assert "not an outbox record" in raw["reason"]
        shown = run_outbox("consumer", "dead-letters", "list", "--consumer", "shipping", env=env)
        assert shown.returncode == 0 and str(events[1].event_id) in shown.stdout  # a table
        every = run_outbox("consumer", "dead-letters", "list", "--json", env=env)
        assert len(json.loads(every.stdout)) == 3  # billing's dead letter of the raw record

        shown = run_outbox(
            "consumer", "dead-letters", "show", "shipping", *place_of(failing), env=env
        )
        assert shown.returncode == 0, shown.stderr
        assert f"event id:  {events[1].event_id}" in shown.stdout
        assert "replay:    possible" in shown.stdout
        assert "  eventType: Step" in shown.stdout and f"  id: {events[1].event_id}" in shown.stdout
        assert shown.stdout.rstrip().endswith((failing.value or b"").decode())
        refused_show = run_outbox(
            "consumer", "dead-letters", "show", "shipping", topic, "0", "3", env=env
        )
        assert "replay:    refused: its header 'eventType'" in refused_show.stdout
        assert "  eventType: \ufffdX" in refused_show.stdout

        # The record whose header was not kept as sent: refused, the dead letter stays.
        refused = run_outbox(
            "consumer", "dead-letters", "replay", "shipping", topic, "0", "3", env=env
        )
        assert refused.returncode == 2, refused.stderr
        assert "not replayed" in refused.stderr and "discard it" in refused.stderr
        assert "0 dead letter(s) replayed" in refused.stdout

        # Fixed, replayed: the same record on the topic, after everything there.
        broken["shipping"] = False
        replayed = run_outbox(
            "consumer", "dead-letters", "replay", "shipping", *place_of(failing), env=env
        )
        assert replayed.returncode == 0, replayed.stderr
        assert f"shipping {failing.place} replayed as {topic}[0]@4" in replayed.stdout
        assert "1 dead letter(s) replayed" in replayed.stdout
        assert "newer events of its aggregate" in replayed.stderr
        records = read_until(bootstrap, topic, lambda r: len(r) >= 5, timeout=60)
        copy = records[4]
        assert (copy.key, copy.value, list(copy.headers)) == (
            failing.key,
            failing.value,
            list(failing.headers),
        )
        again = run_outbox(
            "consumer", "dead-letters", "replay", "shipping", *place_of(failing), env=env
        )
        assert again.returncode == 2 and "no dead letter shipping" in again.stderr

        drain(shipping, lambda: shipping.stats.applied == 3, "shipping handles the copy")
        drain(billing, lambda: billing.stats.duplicates == 1, "billing skips the copy")
        for _ in range(4):  # and nothing more comes
            shipping.poll_once(timeout_seconds=0.5)
        assert (shipping.stats.applied, shipping.stats.dead_lettered) == (3, 2)
        assert billing.stats.applied == 3
        with engine.connect() as connection:
            rows = connection.execute(
                sa.text("SELECT consumer, n FROM applied ORDER BY consumer, n")
            ).all()
        assert [tuple(row) for row in rows] == [
            ("billing", 0),
            ("billing", 1),
            ("billing", 2),
            ("shipping", 0),
            ("shipping", 1),
            ("shipping", 2),
        ]
    finally:
        shipping.close()
        billing.close()
        engine.dispose()

    unsure = run_outbox("consumer", "dead-letters", "discard", "shipping", topic, "0", "3", env=env)
    assert unsure.returncode == 2 and "--yes" in unsure.stderr
    discarded = run_outbox(
        "consumer", "dead-letters", "discard", "shipping", topic, "0", "3", "--yes", env=env
    )
    assert discarded.returncode == 0, discarded.stderr
    assert "1 dead letter(s) discarded" in discarded.stdout
    listed = run_outbox("consumer", "dead-letters", "list", "--consumer", "shipping", env=env)
    assert listed.stdout == "" and "0 dead letter(s)" in listed.stderr
    nothing = run_outbox("consumer", "dead-letters", "replay", "shipping", "--all", env=env)
    assert nothing.returncode == 0 and "0 dead letter(s) replayed" in nothing.stdout
    # billing's own dead letter was not touched by anything done to shipping's.
    left = run_outbox("consumer", "dead-letters", "list", "--json", env=env)
    assert [letter["consumer"] for letter in json.loads(left.stdout)] == ["billing"]


def _role(database: ScratchDatabase, consumer_name: str) -> tuple[str, str]:
    """A login role granted ``--consumer --consumer-name NAME``; its URL."""
    role, password = f"dl_{uuid.uuid4().hex[:8]}", secrets.token_urlsafe(12)
    with database.connect(autocommit=True) as admin:
        admin.execute(
            psycopg.sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
                psycopg.sql.Identifier(role), psycopg.sql.Literal(password)
            )
        )
    granted = run_outbox(
        "db",
        "grant",
        role,
        "--consumer",
        "--consumer-name",
        consumer_name,
        env={"OUTBOX_DATABASE_URL": database.url},
        timeout=60,
    )
    assert granted.returncode == 0, granted.stderr
    url = sa.make_url(database.url).set(username=role, password=password)
    return role, url.render_as_string(hide_password=False)


def _drop(database: ScratchDatabase, role: str) -> None:
    with database.connect(autocommit=True) as admin:
        admin.execute("DELETE FROM outbox.outbox_inbox_consumer WHERE role = %s", (role,))
        identifier = psycopg.sql.Identifier(role)
        admin.execute(psycopg.sql.SQL("DROP OWNED BY {}").format(identifier))
        admin.execute(psycopg.sql.SQL("DROP ROLE {}").format(identifier))


def test_a_consumer_role_sees_replays_and_discards_only_its_own_dead_letters(
    relay_bench: RelayBench,
) -> None:
    database = relay_bench.database
    topic = f"outbox.event.dl{uuid.uuid4().hex[:8]}"
    letters = [("mine-x", 0, 1), ("mine-x", 1, 9), ("mine-x", 2, 0), ("theirs-x", 0, 0)]
    with database.connect() as owner, owner.transaction():
        for consumer, offset, days_ago in letters:  # OUTBOX_INBOX_RETENTION: 7 days
            owner.execute(
                "INSERT INTO outbox.outbox_inbox_dead_letter (consumer, topic, partition, "
                '"offset", event_id, key, value, headers, reason, attempts, failed_at) VALUES '
                "(%s, %s, 0, %s, NULL, %s, %s, %s, 'not an outbox record: test', 1, "
                "now() - make_interval(days => %s))",
                (
                    consumer,
                    topic,
                    offset,
                    b"k",
                    f"value {offset}".encode(),
                    '[["h", "v"]]',
                    days_ago,
                ),
            )
    role, url = _role(database, "mine-x")
    env = {
        "OUTBOX_DATABASE_URL": url,
        "OUTBOX_KAFKA_BOOTSTRAP_SERVERS": relay_bench.kafka.bootstrap_servers,
    }
    try:
        listed = run_outbox("consumer", "dead-letters", "list", "--json", env=env)
        assert listed.returncode == 0, listed.stderr
        assert [
            (letter["consumer"], letter["topic"], letter["partition"], letter["offset"])
            for letter in json.loads(listed.stdout)
        ] == [("mine-x", topic, 0, 1), ("mine-x", topic, 0, 0), ("mine-x", topic, 0, 2)]
        # oldest first
        hidden = run_outbox(
            "consumer", "dead-letters", "show", "theirs-x", topic, "0", "0", env=env
        )
        assert hidden.returncode == 2 and "no dead letter theirs-x" in hidden.stderr
        assert "its own consumer names" in hidden.stderr
        for command in (["replay", "theirs-x", "--all"], ["discard", "theirs-x", "--all", "--yes"]):
            result = run_outbox("consumer", "dead-letters", *command, env=env)
            assert result.returncode == 0, result.stderr
            assert result.stdout.startswith("0 dead letter(s)")

        replayed = run_outbox(
            "consumer", "dead-letters", "replay", "mine-x", topic, "0", "0", env=env
        )
        assert replayed.returncode == 0, replayed.stderr
        # Older than the inbox keeps its claims: refused unless the operator says so.
        old = ["consumer", "dead-letters", "replay", "mine-x", topic, "0", "1"]
        refused = run_outbox(*old, env=env)
        assert refused.returncode == 2 and "--past-inbox-retention" in refused.stderr
        assert "dead-lettered 9.0 days ago" in refused.stderr
        forced = run_outbox(*old, "--past-inbox-retention", env=env)
        assert forced.returncode == 0, forced.stderr
        copies = read_until(relay_bench.kafka.bootstrap_servers, topic, lambda r: len(r) >= 2)
        assert [(c.key, c.value, list(c.headers)) for c in copies] == [
            (b"k", b"value 0", [("h", b"v")]),
            (b"k", b"value 1", [("h", b"v")]),
        ]
        discarded = run_outbox(
            "consumer", "dead-letters", "discard", "mine-x", "--all", "--yes", env=env
        )
        assert discarded.returncode == 0 and "1 dead letter(s) discarded" in discarded.stdout
    finally:
        _drop(database, role)
    with database.connect() as owner:
        left = owner.execute(
            "SELECT consumer FROM outbox.outbox_inbox_dead_letter WHERE topic = %s", (topic,)
        ).fetchall()
    assert left == [("theirs-x",)]
