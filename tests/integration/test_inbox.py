"""The inbox: a consumer's claim is atomic with its side effects; duplicates are skipped."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from datetime import timedelta

import psycopg
import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession
from sqlalchemy.orm import Session

from outbox import AsyncInbox, Inbox, aclaim, claim
from tests.concurrency import run_in_threads
from tests.fix_postgres import ScratchDatabase

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module", autouse=True)
def side_effects(database: ScratchDatabase) -> Iterator[None]:
    with database.connect() as connection:
        connection.execute(
            "CREATE TABLE IF NOT EXISTS applied (message_id text NOT NULL, by_thread int)"
        )
    yield


def applied(database: ScratchDatabase, message_id: str) -> int:
    with database.connect() as connection:
        row = connection.execute(
            "SELECT count(*) FROM applied WHERE message_id = %s", (message_id,)
        ).fetchone()
    assert row is not None
    return int(row[0])


def handle(connection: psycopg.Connection, message_id: str, consumer: str, thread: int) -> bool:
    """What a consumer does: claim, and apply the side effect only for a new message."""
    with connection.transaction():
        if not claim(connection, message_id, consumer=consumer):
            return False
        connection.execute(
            "INSERT INTO applied (message_id, by_thread) VALUES (%s, %s)", (message_id, thread)
        )
        return True


def test_duplicate_delivery_is_skipped(database: ScratchDatabase) -> None:
    message_id = str(uuid.uuid4())
    with database.connect() as connection:
        assert handle(connection, message_id, "billing", 0) is True
        assert handle(connection, message_id, "billing", 0) is False
    assert applied(database, message_id) == 1


def test_claims_are_per_consumer(database: ScratchDatabase, engine: sa.Engine) -> None:
    message_id = uuid.uuid4()
    with Session(engine) as session, session.begin():
        assert Inbox().claim(session, message_id, consumer="billing") is True
        assert Inbox().claim(session, message_id, consumer="shipping") is True
        assert Inbox().claim(session, message_id, consumer="billing") is False


def test_rolled_back_claim_lets_the_message_be_processed_again(database: ScratchDatabase) -> None:
    message_id = str(uuid.uuid4())
    with database.connect() as connection:
        with connection.transaction():
            assert claim(connection, message_id, consumer="billing") is True
            raise psycopg.Rollback  # the handler failed: its claim goes too
        assert handle(connection, message_id, "billing", 0) is True
    assert applied(database, message_id) == 1


def test_concurrent_duplicate_deliveries_apply_exactly_once(database: ScratchDatabase) -> None:
    message_id = str(uuid.uuid4())
    consumers = 8
    start = threading.Barrier(consumers)
    winners: list[int] = []

    def deliver(thread: int) -> None:
        with database.connect() as connection:
            start.wait(timeout=10)
            if handle(connection, message_id, "billing", thread):
                winners.append(thread)

    run_in_threads(deliver, consumers, timeout=30)
    assert len(winners) == 1
    assert applied(database, message_id) == 1


async def test_async_claims(database: ScratchDatabase, async_engine: AsyncEngine) -> None:
    message_id = str(uuid.uuid4())
    async with AsyncSession(async_engine) as session, session.begin():
        assert await AsyncInbox().claim(session, message_id, consumer="billing") is True
    async with await psycopg.AsyncConnection.connect(database.conninfo) as connection:
        async with connection.transaction():
            assert await aclaim(connection, message_id, consumer="billing") is False


def test_expired_claims_are_cleaned_up(database: ScratchDatabase) -> None:
    old, new = str(uuid.uuid4()), str(uuid.uuid4())
    inbox = Inbox()
    with database.connect() as connection:
        with connection.transaction():
            inbox.claim(connection, old, consumer="cleanup")
            inbox.claim(connection, new, consumer="cleanup")
        connection.execute(
            "UPDATE outbox.outbox_inbox SET received_at = now() - interval '8 days' "
            "WHERE message_id = %s",
            (old,),
        )
        connection.commit()
        with connection.transaction():
            assert inbox.delete_expired(connection) >= 1
        with connection.transaction():
            assert inbox.delete_expired(connection, older_than=timedelta(days=30)) == 0
        with connection.transaction():
            assert inbox.claim(connection, old, consumer="cleanup") is True
            assert inbox.claim(connection, new, consumer="cleanup") is False
