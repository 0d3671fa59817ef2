"""The CDC path end to end: SDK commit -> WAL -> Debezium -> the contract record on the broker."""

from __future__ import annotations

import random
import uuid

import psycopg
import pytest

from outbox import Event, Outbox
from outbox.core.contract import event_id_of, record_for, topic_for
from tests.concurrency import run_in_threads
from tests.fix_cdc import CdcPath

pytestmark = pytest.mark.timeout(240)

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def fresh_type() -> str:
    """An aggregate type of its own, so each test reads a topic of its own."""
    return f"t{uuid.uuid4().hex[:10]}"


def test_a_commit_produces_exactly_the_contract_record(cdc: CdcPath) -> None:
    aggregate_type = fresh_type()
    events = [
        Event(
            aggregate_type,
            "42",
            "OrderPlaced",
            {"total": "9.90", "é": [1, None]},
            headers={"tenant": "acme"},
            traceparent=TRACEPARENT,
        ),
        Event(aggregate_type, "42", "OrderPaid", {}),
    ]
    with cdc.database.connect() as connection, connection.transaction():
        Outbox().publish_many(connection, events)
    with cdc.database.connect() as connection:
        rows = connection.execute(
            "SELECT id, aggregatetype, aggregateid, type, payload::text, headers::text, "
            "traceparent, position FROM outbox.outbox WHERE aggregatetype = %s ORDER BY position",
            (aggregate_type,),
        ).fetchall()
    expected = [
        record_for(
            event_id=r[0],
            aggregate_type=r[1],
            aggregate_id=r[2],
            event_type=r[3],
            payload_text=r[4],
            headers_text=r[5],
            traceparent=r[6],
            position=r[7],
        )
        for r in rows
    ]
    received = cdc.consume(topic_for(aggregate_type), 2)
    assert [(m.topic, m.key, m.value, tuple(m.headers)) for m in received] == [  # type: ignore[attr-defined]
        (e.topic, e.key, e.value, e.headers) for e in expected
    ]
    assert [event_id_of(m.headers) for m in received] == [e.event_id for e in events]  # type: ignore[attr-defined]


def test_a_rolled_back_transaction_produces_nothing(cdc: CdcPath) -> None:
    aggregate_type = fresh_type()
    with cdc.database.connect() as connection:
        with connection.transaction():
            Outbox().publish(connection, Event(aggregate_type, "1", "Ghost", {}))
            raise psycopg.Rollback
        with connection.transaction():
            sentinel = Outbox().publish(connection, Event(aggregate_type, "1", "Real", {}))
    received = cdc.consume(topic_for(aggregate_type), 2, timeout=15)
    assert [event_id_of(m.headers) for m in received] == [sentinel.event_id]  # type: ignore[attr-defined]


def test_concurrent_writers_arrive_in_per_aggregate_commit_order(cdc: CdcPath) -> None:
    """1,000 events over 50 aggregates, from 4 writers at once: per aggregate, the order on
    Kafka is the order of the outbox positions, which is commit order (test_ordering)."""
    aggregate_type = fresh_type()

    def writer(seed: int) -> None:
        rng = random.Random(seed)
        with cdc.database.connect() as connection:
            for number in range(50):
                with connection.transaction():
                    Outbox().publish_many(
                        connection,
                        [
                            Event(
                                aggregate_type,
                                str(rng.randrange(50)),
                                "Changed",
                                {"writer": seed, "n": number, "i": i},
                            )
                            for i in range(5)
                        ],
                    )

    run_in_threads(writer, 4, timeout=120)
    received = cdc.consume(topic_for(aggregate_type), 1000, timeout=120)
    assert len(received) == 1000
    on_kafka: dict[bytes, list[uuid.UUID]] = {}
    for message in received:
        on_kafka.setdefault(message.key, []).append(event_id_of(message.headers))  # type: ignore[attr-defined]
    with cdc.database.connect() as connection:
        rows = connection.execute(
            "SELECT aggregateid, id FROM outbox.outbox WHERE aggregatetype = %s ORDER BY position",
            (aggregate_type,),
        ).fetchall()
    in_commit_order: dict[bytes, list[uuid.UUID]] = {}
    for aggregate_id, event_id in rows:
        in_commit_order.setdefault(aggregate_id.encode(), []).append(event_id)
    assert on_kafka == in_commit_order
