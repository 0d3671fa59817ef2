"""Aggregate types that would poison CDC or collide on Kafka are refused when published.

Kafka treats ``.`` and ``_`` alike in topic names: ``outbox.event.order.line`` and
``outbox.event.order_line`` cannot both exist, and the second one's records would fail
(the connector's task for every service, or the relay's batches). The database refuses the
second aggregate type in the publishing transaction; it also refuses, by a CHECK, any
aggregate type the SDK refuses, so a hand-written INSERT cannot create a poison row.
"""

from __future__ import annotations

import string
import threading
import uuid

import psycopg
import pytest
import sqlalchemy as sa
from kafka import KafkaProducer

import outbox_migrations
from outbox import Event, Outbox
from outbox.core.contract import topic_for
from tests.cli import run_outbox
from tests.fix_postgres import ScratchDatabase
from tests.fix_relay import RelayBench, wait_until

pytestmark = pytest.mark.timeout(60)


def test_an_aggregate_type_colliding_on_kafka_is_refused_at_publish_time(
    database: ScratchDatabase,
) -> None:
    base = f"t{uuid.uuid4().hex[:8]}"
    with database.connect() as connection:
        with connection.transaction():
            Outbox().publish(connection, Event(f"{base}.line", "1", "Added", {}))
        with connection.transaction():  # the same type again: fine
            Outbox().publish(connection, Event(f"{base}.line", "2", "Added", {}))
        with pytest.raises(psycopg.errors.CheckViolation) as refused:
            with connection.transaction():
                Outbox().publish(connection, Event(f"{base}_line", "1", "Added", {}))
        message = str(refused.value)
        assert f"{base}_line" in message and f"{base}.line" in message
        assert "collides" in message
        with connection.transaction():  # distinct in more than '.' and '_': fine
            Outbox().publish(connection, Event(f"{base}-line", "1", "Added", {}))


def test_a_hand_written_row_with_an_invalid_aggregate_type_is_refused(
    database: ScratchDatabase,
) -> None:
    with database.connect() as connection:
        for bad in ("order line", "order/line", "", "x" * 201, "ordér"):
            with pytest.raises(psycopg.errors.CheckViolation, match="aggregatetype"):
                with connection.transaction():
                    connection.execute(
                        "INSERT INTO outbox.outbox (id, aggregatetype, aggregateid, type, payload)"
                        " VALUES (gen_random_uuid(), %s, '1', 'X', '{}')",
                        (bad,),
                    )


def test_every_aggregate_type_the_sdk_accepts_passes_the_databases_check(
    database: ScratchDatabase,
) -> None:
    """The CHECK is the SDK's rule (outbox_0010 writes its length apart from the pattern):
    the shortest, the longest and every character of the alphabet pass."""
    alphabet = string.ascii_letters + string.digits + "._-"
    with database.connect() as connection:
        for good in ("x", "y" * 200, alphabet):
            Event(good, "1", "X", {})  # the SDK's own check
            with connection.transaction():
                connection.execute(
                    "INSERT INTO outbox.outbox (id, aggregatetype, aggregateid, type, payload)"
                    " VALUES (gen_random_uuid(), %s, '1', 'X', '{}')",
                    (good,),
                )
                raise psycopg.Rollback  # leaves the registry without these types


def published_types(database: ScratchDatabase, base: str) -> list[str]:
    with database.connect() as connection:
        return [
            row[0]
            for row in connection.execute(
                "SELECT DISTINCT aggregatetype FROM outbox.outbox WHERE aggregatetype LIKE %s "
                "ORDER BY 1",
                (f"{base}%",),
            )
        ]


@pytest.mark.parametrize("first_committed", [True, False], ids=["commits", "rolls back"])
def test_two_colliding_new_types_published_at_once_let_exactly_one_through(
    database: ScratchDatabase, first_committed: bool
) -> None:
    """The first transaction to publish a new type registers it until it ends; one that
    publishes a colliding type meanwhile waits for it (it used to be let through: both
    types reached the outbox), then is refused, or registers its own type if the first
    rolled back."""
    base = f"t{uuid.uuid4().hex[:8]}"
    outcome: list[BaseException | None] = []
    with database.connect(autocommit=True) as first:
        first.execute("BEGIN")
        Outbox().publish(first, Event(f"{base}.line", "1", "Added", {}))

        def second() -> None:
            try:
                with database.connect() as connection, connection.transaction():
                    connection.execute("SET application_name = 'second_publisher'")
                    Outbox().publish(connection, Event(f"{base}_line", "1", "Added", {}))
                outcome.append(None)
            except BaseException as error:
                outcome.append(error)

        thread = threading.Thread(target=second)
        thread.start()
        try:
            wait_until(
                lambda: bool(outcome) or waiting(database, "second_publisher"),
                timeout=20,
                what="the second publisher ends or waits",
            )
            assert not outcome, (
                f"{base}_line went through while {base}.line was being registered: {outcome}"
            )
        finally:
            first.execute("COMMIT" if first_committed else "ROLLBACK")
            thread.join(timeout=20)
    assert not thread.is_alive()
    if first_committed:
        assert isinstance(outcome[0], psycopg.errors.CheckViolation), outcome
        assert published_types(database, base) == [f"{base}.line"]
    else:
        assert outcome == [None]
        assert published_types(database, base) == [f"{base}_line"]


def waiting(database: ScratchDatabase, application: str) -> bool:
    """A session named ``application`` waits for a lock."""
    with database.connect() as connection:
        row = connection.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s "
            "AND wait_event_type = 'Lock'",
            (application,),
        ).fetchone()
    return row is not None and row[0] > 0


@pytest.mark.parametrize("start", ["outbox_0004", "outbox_0006"])
def test_types_delivered_before_the_registry_are_registered_on_upgrade(
    empty_database: ScratchDatabase, start: str
) -> None:
    """The registry (outbox_0005) was filled only from the rows still in the outbox, so a
    type already delivered (its rows gone) could get a colliding twin. The upgrade
    registers the types the database still knows were delivered: topics the relay read
    (CDC offsets) and consumers dead-lettered, and the relay's dead letters last (a
    dead letter may be one refused for a collision)."""
    engine = sa.create_engine(empty_database.url)
    try:
        with engine.begin() as connection:
            outbox_migrations.upgrade(connection, start)
    finally:
        engine.dispose()
    with empty_database.connect() as connection:
        for n, topic in enumerate(
            ("outbox.event.order.line", "outbox.event.both.x", "payments.raw", "outbox.event.")
        ):
            connection.execute(
                "INSERT INTO outbox.outbox_inbox_dead_letter (consumer, topic, partition, "
                "\"offset\", headers, reason, attempts) VALUES ('c', %s, 0, %s, '[]', 'r', 1)",
                (topic, n),
            )
        connection.execute(
            "INSERT INTO outbox.outbox_relay_offset (topic, partition, next_offset) VALUES "
            "('outbox.event.shipment.label', 0, 7), ('outbox.outbox.outbox_heartbeat', 0, 3)"
        )
        for n, aggregate_type in enumerate(("refund.note", "both_x")):
            connection.execute(
                "INSERT INTO outbox.outbox_dead_letter (id, aggregatetype, aggregateid, type, "
                "payload, headers, traceparent, position, created_at, reason) VALUES "
                "(gen_random_uuid(), %s, '1', 'T', '{}', '{}', '', %s, now(), 'r')",
                (aggregate_type, n),
            )
        connection.commit()
    engine = sa.create_engine(empty_database.url)
    try:
        with engine.begin() as connection:
            outbox_migrations.upgrade(connection)
    finally:
        engine.dispose()
    with empty_database.connect() as connection:
        for refused in ("order_line", "shipment_label", "refund_note", "both_x"):
            with pytest.raises(psycopg.errors.CheckViolation, match="collides"):
                with connection.transaction():
                    Outbox().publish(connection, Event(refused, "1", "Added", {}))
        with connection.transaction():  # the registered types themselves publish
            for known in ("order.line", "shipment.label", "refund.note", "both.x"):
                Outbox().publish(connection, Event(known, "1", "Added", {}))
        registered = {
            row[0] for row in connection.execute("SELECT aggregatetype FROM outbox.outbox_topic")
        }
    assert registered == {"order.line", "shipment.label", "refund.note", "both.x"}


def test_types_only_the_broker_knows_are_registered_by_hand(relay_bench: RelayBench) -> None:
    """A type delivered and gone before the registry (nothing in the database shows it):
    ``outbox db register-types`` registers it by name or from the broker's topics; a
    colliding twin is then refused, and a collision among them is reported (exit 2)."""
    base = f"t{uuid.uuid4().hex[:8]}"
    bootstrap = relay_bench.kafka.bootstrap_servers
    env = {"OUTBOX_DATABASE_URL": relay_bench.database.url}
    producer = KafkaProducer(bootstrap_servers=bootstrap)
    producer.send(topic_for(f"{base}.kafka"), key=b"1", value=b"{}").get(timeout=30)
    producer.close()
    by_name = run_outbox("db", "register-types", f"{base}.named", "not a type", env=env)
    assert by_name.returncode == 0, by_name.stderr
    assert "1 type(s) registered" in by_name.stdout and "not a type" in by_name.stderr
    from_kafka = run_outbox(
        "db",
        "register-types",
        "--from-kafka",
        env={**env, "OUTBOX_KAFKA_BOOTSTRAP_SERVERS": bootstrap},
    )
    assert from_kafka.returncode == 0, from_kafka.stderr
    assert f"{base}.kafka" in from_kafka.stdout
    colliding = run_outbox("db", "register-types", f"{base}_named", f"{base}.named", env=env)
    assert colliding.returncode == 2
    assert f"{base}_named collides with the registered type {base}.named" in colliding.stderr
    assert "1 already registered" in colliding.stdout
    with relay_bench.database.connect() as connection:
        for twin in (f"{base}_named", f"{base}_kafka"):
            with pytest.raises(psycopg.errors.CheckViolation, match="collides"):
                with connection.transaction():
                    Outbox().publish(connection, Event(twin, "1", "Added", {}))
