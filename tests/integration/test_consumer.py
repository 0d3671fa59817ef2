"""The SDK's idempotent Kafka consumer, with the example shipping service, on the real stack."""

from __future__ import annotations

import threading
import uuid
from typing import Any

import pytest
import sqlalchemy as sa
from kafka import KafkaProducer
from sqlalchemy.orm import Session

from outbox import Event, Outbox
from outbox.consumer import IdempotentConsumer, ReceivedEvent
from outbox.core.contract import event_id_of, topic_for
from outbox_examples import order_service, shipping_service
from tests.fix_relay import RelayBench, wait_until
from tests.kafka_read import read_until

FAST_GROUP = {
    "session_timeout_ms": 6000,
    "heartbeat_interval_ms": 1000,
    "max_poll_interval_ms": 6000,
}


def drain(consumer: IdempotentConsumer[Any], until: Any, timeout: float = 90) -> None:
    """Poll until ``until()`` holds (the consumer is driven by the test's own thread)."""
    wait_until(
        lambda: consumer.poll_once(timeout_seconds=0.5) >= 0 and until(),
        timeout=timeout,
        what="the consumer catches up",
    )


def test_the_shipping_service_applies_every_event_once_while_duplicates_arrive(
    relay_bench: RelayBench,
) -> None:
    engine = sa.create_engine(relay_bench.database.url)
    order_service.create_schema(engine)
    shipping_service.create_schema(engine)
    summary = order_service.run(engine, 30)
    bootstrap = relay_bench.kafka.bootstrap_servers
    topic = topic_for("order")
    with relay_bench.in_thread():
        wait_until(lambda: relay_bench.undelivered() == 0, timeout=60, what="orders relayed")
    records: list[Any] = read_until(
        bootstrap, topic, lambda r: len(r) >= summary.placed + summary.paid, timeout=60
    )
    # Inject a duplicate of every record, as a connector crash or a relay switch would.
    producer = KafkaProducer(bootstrap_servers=bootstrap)
    for record in records:
        producer.send(topic, key=record.key, value=record.value, headers=record.headers)
    producer.flush()
    producer.close()
    events = {event_id_of(r.headers): r for r in records}
    paid = {i for i, r in events.items() if dict(r.headers)["eventType"] == b"OrderPaid"}
    placed = {i for i, r in events.items() if dict(r.headers)["eventType"] == b"OrderPlaced"}
    assert len(paid) >= summary.paid and len(placed) >= summary.placed

    group = f"shipping-{uuid.uuid4().hex[:8]}"
    service = shipping_service.consumer(
        engine, bootstrap, group_id=group, consumer_options=FAST_GROUP
    )
    try:
        drain(service, lambda: service.stats.applied + service.stats.duplicates >= 2 * len(events))
    finally:
        service.close()
    assert service.stats.applied == len(events)
    assert service.stats.duplicates == len(events)
    assert shipping_service.shipments(engine) == len(paid)
    with engine.connect() as connection:
        total_orders = connection.execute(
            sa.text("SELECT sum(orders) FROM shipping.customer_orders")
        ).scalar()
    assert total_orders == len(placed)

    # A second deployment reading everything again (a new group) changes nothing.
    again = shipping_service.consumer(
        engine, bootstrap, group_id=f"{group}-again", consumer_options=FAST_GROUP
    )
    try:
        drain(again, lambda: again.stats.duplicates >= 2 * len(events))
    finally:
        again.close()
    assert again.stats.applied == 0
    assert shipping_service.shipments(engine) == len(paid)
    engine.dispose()


def test_poison_records_go_to_the_dead_letters_and_the_partition_moves_on(
    relay_bench: RelayBench,
) -> None:
    aggregate_type = f"c{uuid.uuid4().hex[:10]}"
    topic = topic_for(aggregate_type)
    bootstrap = relay_bench.kafka.bootstrap_servers
    with relay_bench.database.connect() as connection, connection.transaction():
        events = [Event(aggregate_type, "1", "Step", {"n": n}) for n in range(5)]
        Outbox().publish_many(connection, events)
    with relay_bench.in_thread():
        wait_until(lambda: relay_bench.undelivered() == 0, timeout=60, what="relayed")
    producer = KafkaProducer(bootstrap_servers=bootstrap)
    producer.send(topic, key=b"1", value=b"not json at all", headers=[("eventType", b"X")])
    producer.flush()
    producer.close()

    engine = sa.create_engine(relay_bench.database.url)
    with engine.begin() as connection:
        connection.exec_driver_sql("CREATE TABLE applied (n int PRIMARY KEY)")
    bad = events[2].event_id

    def handler(session: Session, event: ReceivedEvent) -> None:
        if event.event_id == bad:
            raise RuntimeError("this one always fails")
        session.execute(sa.text("INSERT INTO applied VALUES (:n)"), {"n": event.payload["n"]})

    consumer = IdempotentConsumer(
        name="poison-test",
        group_id=f"poison-{uuid.uuid4().hex[:8]}",
        topics=[topic],
        bootstrap_servers=bootstrap,
        begin=sa.orm.sessionmaker(engine).begin,
        handler=handler,
        max_attempts=3,
        retry_backoff_seconds=0.05,
        consumer_options=FAST_GROUP,
    )
    try:
        drain(consumer, lambda: consumer.stats.dead_lettered >= 2 and consumer.stats.applied >= 4)
    finally:
        consumer.close()
    with engine.connect() as connection:
        applied = connection.execute(sa.text("SELECT n FROM applied ORDER BY n")).scalars().all()
        letters = connection.execute(
            sa.text(
                "SELECT event_id, reason, attempts, value FROM outbox.outbox_inbox_dead_letter "
                "WHERE consumer = 'poison-test' ORDER BY \"offset\""
            )
        ).all()
    assert applied == [0, 1, 3, 4]  # the events after the failing one were not blocked
    assert [(row.event_id, row.attempts) for row in letters] == [(str(bad), 3), (None, 1)]
    assert "this one always fails" in letters[0].reason
    assert "not an outbox record" in letters[1].reason
    assert bytes(letters[1].value) == b"not json at all"
    engine.dispose()


def test_consumer_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match="topics"):
        IdempotentConsumer(
            name="x",
            group_id="x",
            bootstrap_servers="127.0.0.1:1",
            begin=threading.Lock,  # never used
            handler=lambda _t, _e: None,
        )


def test_a_statement_timeout_is_an_attempt_not_an_outage(relay_bench: RelayBench) -> None:
    """``QueryCanceled`` is an ``OperationalError`` for psycopg: it used to be retried for
    ever as if the database were down, blocking the partition. It counts as an attempt."""
    aggregate_type = f"t{uuid.uuid4().hex[:10]}"
    topic = topic_for(aggregate_type)
    bootstrap = relay_bench.kafka.bootstrap_servers
    with relay_bench.database.connect() as connection, connection.transaction():
        events = [Event(aggregate_type, "1", "Step", {"n": n}) for n in range(3)]
        Outbox().publish_many(connection, events)
    with relay_bench.in_thread():
        wait_until(lambda: relay_bench.undelivered() == 0, timeout=60, what="relayed")
    engine = sa.create_engine(relay_bench.database.url)
    slow = events[1].event_id

    def handler(session: Session, event: ReceivedEvent) -> None:
        if event.event_id == slow:  # a query that always outlives its statement timeout
            session.execute(sa.text("SET LOCAL statement_timeout = '20ms'"))
            session.execute(sa.text("SELECT pg_sleep(1)"))

    consumer = IdempotentConsumer(
        name="timeout-test",
        group_id=f"timeout-{uuid.uuid4().hex[:8]}",
        topics=[topic],
        bootstrap_servers=bootstrap,
        begin=sa.orm.sessionmaker(engine).begin,
        handler=handler,
        max_attempts=2,
        retry_backoff_seconds=0.05,
        consumer_options=FAST_GROUP,
    )
    try:
        drain(
            consumer,
            lambda: consumer.stats.dead_lettered >= 1 and consumer.stats.applied >= 2,
            timeout=60,
        )
    finally:
        consumer.close()
    assert consumer.stats.handler_failures == 2
    with engine.connect() as connection:
        reason = connection.execute(
            sa.text(
                "SELECT reason FROM outbox.outbox_inbox_dead_letter WHERE consumer = 'timeout-test'"
            )
        ).scalar_one()
    assert "QueryCanceled" in reason
    engine.dispose()


def test_a_lone_surrogate_in_a_handlers_error_is_dead_lettered_not_a_crash(
    relay_bench: RelayBench,
) -> None:
    """JSON may escape a lone surrogate (``"\\ud800"``): Python decodes it, PostgreSQL cannot
    store it. A handler error that quotes it used to make writing the dead letter raise
    ``UnicodeEncodeError``, stopping the consumer on this record after every restart."""
    aggregate_type = f"u{uuid.uuid4().hex[:10]}"
    topic = topic_for(aggregate_type)
    bootstrap = relay_bench.kafka.bootstrap_servers
    event_id = uuid.uuid4()
    producer = KafkaProducer(bootstrap_servers=bootstrap)
    producer.send(
        topic,
        key=b"1",
        value=b'{"note": "\\ud800 and \\u0000"}',
        headers=[("id", str(event_id).encode()), ("eventType", b"Noted"), ("we\x00ird", b"\x00")],
    )
    producer.flush()
    producer.close()
    engine = sa.create_engine(relay_bench.database.url)

    def handler(_session: Session, event: ReceivedEvent) -> None:
        raise ValueError(f"cannot ship {event.payload['note']!s}")

    consumer = IdempotentConsumer(
        name="surrogate-test",
        group_id=f"surrogate-{uuid.uuid4().hex[:8]}",
        topics=[topic],
        bootstrap_servers=bootstrap,
        begin=sa.orm.sessionmaker(engine).begin,
        handler=handler,
        max_attempts=1,
        retry_backoff_seconds=0.05,
        consumer_options=FAST_GROUP,
    )
    try:
        drain(consumer, lambda: consumer.stats.dead_lettered >= 1, timeout=60)
    finally:
        consumer.close()
    with engine.connect() as connection:
        letter = connection.execute(
            sa.text(
                "SELECT event_id, reason, headers FROM outbox.outbox_inbox_dead_letter "
                "WHERE consumer = 'surrogate-test'"
            )
        ).one()
    assert letter.event_id == str(event_id)
    assert letter.reason == "ValueError: cannot ship \ufffd and \ufffd"
    assert ["we\ufffdird", "\ufffd"] in letter.headers
    engine.dispose()


def test_a_copy_with_other_content_under_a_relayed_id_is_dead_lettered(
    relay_bench: RelayBench,
) -> None:
    """Issue 31: a record reusing (or forging) a delivered event's id with another payload
    is no duplicate: it is dead-lettered with the reason, and the handler never sees it. An
    exact copy of a relayed record is still a duplicate."""
    aggregate_type = f"f{uuid.uuid4().hex[:10]}"
    topic = topic_for(aggregate_type)
    bootstrap = relay_bench.kafka.bootstrap_servers
    with relay_bench.database.connect() as connection, connection.transaction():
        events = [Event(aggregate_type, "1", "Paid", {"amount": n}) for n in (10, 20)]
        Outbox().publish_many(connection, events)
    with relay_bench.in_thread():
        wait_until(lambda: relay_bench.undelivered() == 0, timeout=60, what="relayed")
    relayed: list[Any] = read_until(bootstrap, topic, lambda r: len(r) >= 2, timeout=60)
    producer = KafkaProducer(bootstrap_servers=bootstrap)
    first, second = relayed
    producer.send(topic, key=first.key, value=b'{"amount": 10000}', headers=first.headers)
    producer.send(topic, key=second.key, value=second.value, headers=second.headers)
    producer.flush()
    producer.close()

    engine = sa.create_engine(relay_bench.database.url)
    handled: list[ReceivedEvent] = []
    consumer = IdempotentConsumer(
        name="forgery-test",
        group_id=f"forgery-{uuid.uuid4().hex[:8]}",
        topics=[topic],
        bootstrap_servers=bootstrap,
        begin=engine.begin,
        handler=lambda _connection, event: handled.append(event),
        consumer_options=FAST_GROUP,
    )
    try:
        drain(consumer, lambda: consumer.stats.dead_lettered + consumer.stats.duplicates >= 2)
    finally:
        consumer.close()
    assert [event.payload for event in handled] == [{"amount": 10}, {"amount": 20}]
    assert (consumer.stats.applied, consumer.stats.duplicates) == (2, 1)
    assert consumer.stats.dead_lettered == 1
    with engine.connect() as connection:
        letter = connection.execute(
            sa.text(
                "SELECT event_id, reason, value FROM outbox.outbox_inbox_dead_letter "
                "WHERE consumer = 'forgery-test'"
            )
        ).one()
    assert letter.event_id == str(events[0].event_id)
    assert f"event id {events[0].event_id}: a copy with other content" in letter.reason
    assert bytes(letter.value) == b'{"amount": 10000}'
    engine.dispose()
