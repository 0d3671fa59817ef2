"""Producer-side dedup keys: a second publish with a live key is a no-op that says so."""

from __future__ import annotations

import threading
import uuid
from datetime import timedelta

import psycopg
import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from outbox import AsyncOutbox, Event, Outbox, OutboxSettings
from tests.concurrency import run_in_threads
from tests.fix_postgres import ScratchDatabase

pytestmark = pytest.mark.timeout(60)


def paid(order: str, key: str | None) -> Event:
    return Event("order", order, "OrderPaid", {"order": order}, dedup_key=key)


def events_of(database: ScratchDatabase, order: str) -> list[uuid.UUID]:
    with database.connect() as connection:
        return [
            row[0]
            for row in connection.execute(
                "SELECT id FROM outbox.outbox WHERE aggregateid = %s ORDER BY position", (order,)
            )
        ]


def test_second_publish_with_a_live_key_is_a_no_op(database: ScratchDatabase) -> None:
    order, key = uuid.uuid4().hex, f"pay-{uuid.uuid4()}"
    outbox = Outbox()
    with database.connect() as connection, connection.transaction():
        first = outbox.publish(connection, paid(order, key))
    with database.connect() as connection, connection.transaction():
        second = outbox.publish(connection, paid(order, key))
    assert first.duplicate is False
    assert second.duplicate is True
    assert second.event_id == first.event_id, "a duplicate reports the original event id"
    assert events_of(database, order) == [first.event_id]


def test_key_holds_after_the_event_was_delivered_and_removed(database: ScratchDatabase) -> None:
    order, key = uuid.uuid4().hex, f"pay-{uuid.uuid4()}"
    outbox = Outbox()
    with database.connect() as connection, connection.transaction():
        first = outbox.publish(connection, paid(order, key))
    with database.connect() as connection:  # what a relay does after delivery
        connection.execute("DELETE FROM outbox.outbox WHERE id = %s", (first.event_id,))
    with database.connect() as connection, connection.transaction():
        again = outbox.publish(connection, paid(order, key))
    assert again.duplicate is True and again.event_id == first.event_id
    assert events_of(database, order) == []


def test_expired_key_publishes_again(database: ScratchDatabase) -> None:
    order, key = uuid.uuid4().hex, f"pay-{uuid.uuid4()}"
    outbox = Outbox(OutboxSettings(dedup_window=timedelta(hours=1)))
    with database.connect() as connection, connection.transaction():
        first = outbox.publish(connection, paid(order, key))
    with database.connect() as connection:  # age the key past the window
        connection.execute(
            "UPDATE outbox.outbox_dedup SET created_at = now() - interval '2 hours' "
            "WHERE dedup_key = %s",
            (key,),
        )
    with database.connect() as connection, connection.transaction():
        second = outbox.publish(connection, paid(order, key))
    assert second.duplicate is False and second.event_id != first.event_id
    assert events_of(database, order) == [first.event_id, second.event_id]


def test_rolled_back_publish_does_not_consume_the_key(database: ScratchDatabase) -> None:
    order, key = uuid.uuid4().hex, f"pay-{uuid.uuid4()}"
    outbox = Outbox()
    with database.connect() as connection:
        with connection.transaction():
            outbox.publish(connection, paid(order, key))
            raise psycopg.Rollback
        with connection.transaction():
            result = outbox.publish(connection, paid(order, key))
    assert result.duplicate is False
    assert events_of(database, order) == [result.event_id]


def test_keys_repeated_within_one_batch(database: ScratchDatabase, engine: sa.Engine) -> None:
    order = uuid.uuid4().hex
    key_a, key_b = f"a-{order}", f"b-{order}"
    batch = [paid(order, key_a), paid(order, None), paid(order, key_a), paid(order, key_b)]
    with Session(engine) as session, session.begin():
        results = Outbox().publish_many(session, batch)
    assert [r.duplicate for r in results] == [False, False, True, False]
    assert results[2].event_id == batch[0].event_id
    assert events_of(database, order) == [batch[0].event_id, batch[1].event_id, batch[3].event_id]


def test_concurrent_publishes_with_one_key_write_exactly_one_event(
    database: ScratchDatabase,
) -> None:
    order, key = uuid.uuid4().hex, f"pay-{uuid.uuid4()}"
    outbox = Outbox()
    writers = 8
    start = threading.Barrier(writers)
    results: list[bool] = []

    def writer(_number: int) -> None:
        with database.connect() as connection:
            start.wait(timeout=10)
            with connection.transaction():
                results.append(outbox.publish(connection, paid(order, key)).duplicate)

    run_in_threads(writer, writers, timeout=30)
    assert sorted(results) == [False] + [True] * (writers - 1)
    assert len(events_of(database, order)) == 1


async def test_async_dedup(database: ScratchDatabase) -> None:
    order, key = uuid.uuid4().hex, f"pay-{uuid.uuid4()}"
    outbox = AsyncOutbox()
    async with await psycopg.AsyncConnection.connect(database.conninfo) as connection:
        async with connection.transaction():
            first = await outbox.publish(connection, paid(order, key))
        async with connection.transaction():
            second = await outbox.publish(connection, paid(order, key))
    assert (first.duplicate, second.duplicate) == (False, True)
    assert second.event_id == first.event_id


def test_expired_keys_are_cleaned_up(database: ScratchDatabase) -> None:
    key_old, key_new = f"old-{uuid.uuid4()}", f"new-{uuid.uuid4()}"
    outbox = Outbox()
    with database.connect() as connection, connection.transaction():
        outbox.publish_many(connection, [paid("c", key_old), paid("c", key_new)])
    with database.connect() as connection:
        connection.execute(
            "UPDATE outbox.outbox_dedup SET created_at = now() - interval '25 hours' "
            "WHERE dedup_key = %s",
            (key_old,),
        )
    with database.connect() as connection, connection.transaction():
        deleted = outbox.delete_expired_dedup_keys(connection)
    assert deleted >= 1
    with database.connect() as connection:
        left = {
            row[0]
            for row in connection.execute(
                "SELECT dedup_key FROM outbox.outbox_dedup WHERE dedup_key = ANY(%s)",
                ([key_old, key_new],),
            )
        }
    assert left == {key_new}
