"""Two copies of one event id with different content are never duplicates (issue 31), on
PostgreSQL: the inbox keeps each claim's digest (outbox_0009), ``Inbox.claim(digest=...)``
raises on a conflicting copy, and ``IdempotentConsumer`` dead-letters it with the reason,
never calling the handler. The consumer here reads a list of records instead of Kafka (the
same consumer on the broker: tests/integration/test_consumer.py); the pure parts:
tests/unit/test_inbox_digest.py."""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Iterator
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession

import outbox_migrations
from outbox import AsyncInbox, Inbox
from outbox.consumer import IdempotentConsumer, ReceivedEvent
from outbox.core.contract import record_for
from outbox.core.errors import ConfigurationError
from outbox.core.kafka_record import KafkaRecord, content_digest
from outbox.inbox import ConflictingCopyError
from tests.fix_postgres import ScratchDatabase
from tests.integration.test_least_privilege import connect_as, drop_role, make_role

pytestmark = pytest.mark.timeout(120)


class ListReader:
    """Stands in for the consumer's Kafka reader: each poll returns the next batch."""

    batches: list[list[KafkaRecord]] = []

    def __init__(self, _settings: object, _role: object) -> None:
        self.commits = 0

    def subscribe(self, _topics: object, _pattern: object) -> None:
        pass

    def poll(self, _timeout_seconds: float) -> list[KafkaRecord]:
        return ListReader.batches.pop(0) if ListReader.batches else []

    def commit(self) -> None:
        self.commits += 1

    def close(self) -> None:
        pass


def record(
    event_id: uuid.UUID, payload: str, *, offset: int, topic: str = "outbox.event.order"
) -> KafkaRecord:
    contract = record_for(
        event_id=event_id,
        aggregate_type=topic.removeprefix("outbox.event."),
        aggregate_id="42",
        event_type="OrderPlaced",
        payload_text=payload,
        headers_text="{}",
        traceparent="",
        position=1,  # where a copy was read is no part of what it says
    )
    return KafkaRecord(
        topic=contract.topic,
        partition=0,
        offset=offset,
        timestamp_ms=0,
        key=contract.key,
        value=contract.value,
        headers=list(contract.headers),
    )


def digest_of(copy: KafkaRecord) -> str:
    return content_digest(copy.key, copy.value, copy.headers)


def consume(
    url: str, name: str, batches: Iterable[list[KafkaRecord]], monkeypatch: pytest.MonkeyPatch
) -> tuple[IdempotentConsumer[Any], list[ReceivedEvent]]:
    """Run a consumer named ``name`` over ``batches`` (one poll each); what it handled."""
    monkeypatch.setattr("outbox.consumer.KafkaReader", ListReader)
    ListReader.batches = list(batches)
    handled: list[ReceivedEvent] = []
    engine = sa.create_engine(url)

    def handler(connection: sa.Connection, event: ReceivedEvent) -> None:
        connection.execute(sa.text("SELECT 1"))
        handled.append(event)

    consumer: IdempotentConsumer[Any] = IdempotentConsumer(
        name=name,
        group_id=name,
        bootstrap_servers="127.0.0.1:1",  # never reached: the list reader stands in
        topics=["outbox.event.order"],
        begin=engine.begin,
        handler=handler,
        retry_backoff_seconds=0.01,
    )
    try:
        while ListReader.batches:
            consumer.poll_once(timeout_seconds=0)
    finally:
        consumer.close()
        engine.dispose()
    return consumer, handled


def dead_letters(database: ScratchDatabase, consumer: str) -> list[tuple[Any, ...]]:
    with database.connect() as connection:
        return connection.execute(
            'SELECT event_id, "offset", reason, attempts, value '
            'FROM outbox.outbox_inbox_dead_letter WHERE consumer = %s ORDER BY "offset"',
            (consumer,),
        ).fetchall()


def claimed_digest(database: ScratchDatabase, consumer: str, message_id: object) -> Any:
    with database.connect() as connection:
        row = connection.execute(
            "SELECT digest FROM outbox.outbox_inbox WHERE consumer = %s AND message_id = %s",
            (consumer, str(message_id)),
        ).fetchone()
    assert row is not None, "no claim"
    return row[0]


# -- IdempotentConsumer ------------------------------------------------------------------------


def test_a_copy_with_the_same_content_is_a_duplicate(
    database: ScratchDatabase, monkeypatch: pytest.MonkeyPatch
) -> None:
    event_id = uuid.uuid4()
    first, again = (
        record(event_id, '{"total": 1}', offset=0),
        record(event_id, '{"total": 1}', offset=1),
    )
    name = f"same-{uuid.uuid4().hex[:8]}"
    consumer, handled = consume(database.url, name, [[first], [again]], monkeypatch)
    assert [event.event_id for event in handled] == [event_id]
    assert (consumer.stats.applied, consumer.stats.duplicates, consumer.stats.dead_lettered) == (
        1,
        1,
        0,
    )
    assert claimed_digest(database, name, event_id) == digest_of(first)
    assert dead_letters(database, name) == []


def test_a_copy_with_other_content_is_dead_lettered_with_the_reason(
    database: ScratchDatabase, monkeypatch: pytest.MonkeyPatch
) -> None:
    event_id, other_id = uuid.uuid4(), uuid.uuid4()
    first = record(event_id, '{"total": 1}', offset=0)
    forged = record(event_id, '{"total": 1000}', offset=1)
    after = record(other_id, '{"total": 2}', offset=2)
    name = f"forged-{uuid.uuid4().hex[:8]}"
    # The forged copy twice (a redelivery of it), and the partition goes on after it.
    consumer, handled = consume(
        database.url, name, [[first], [forged, after], [forged]], monkeypatch
    )
    assert [(event.event_id, event.payload) for event in handled] == [
        (event_id, {"total": 1}),
        (other_id, {"total": 2}),
    ], "the handler saw the forged copy"
    assert consumer.stats.applied == 2 and consumer.stats.duplicates == 0
    assert consumer.stats.dead_lettered == 2 and consumer.stats.handler_failures == 0
    letters = dead_letters(database, name)
    assert len(letters) == 1, "one dead letter per record: the redelivery updates it"
    letter_id, offset, reason, attempts, value = letters[0]
    assert (letter_id, offset, attempts, bytes(value)) == (str(event_id), 1, 1, forged.value)
    assert f"event id {event_id}: a copy with other content was handled first" in reason
    assert "reused or forged" in reason
    assert claimed_digest(database, name, event_id) == digest_of(first), "the claim is kept"


def test_a_claim_from_before_digests_takes_any_copy_as_a_duplicate(
    database: ScratchDatabase, monkeypatch: pytest.MonkeyPatch
) -> None:
    event_id = uuid.uuid4()
    name = f"legacy-{uuid.uuid4().hex[:8]}"
    with database.connect() as connection, connection.transaction():
        assert Inbox().claim(connection, event_id, consumer=name) is True  # no digest kept
    assert claimed_digest(database, name, event_id) is None
    copies = [[record(event_id, '{"total": 1}', offset=0)], [record(event_id, "{}", offset=1)]]
    consumer, handled = consume(database.url, name, copies, monkeypatch)
    assert handled == []
    assert (consumer.stats.duplicates, consumer.stats.dead_lettered) == (2, 0)
    assert claimed_digest(database, name, event_id) is None, "an unknown content stays unknown"


# -- Inbox.claim(digest=...) --------------------------------------------------------------------


def test_inbox_claims_with_digests(database: ScratchDatabase) -> None:
    inbox, message = Inbox(), str(uuid.uuid4())
    with database.connect() as connection:
        with connection.transaction():
            assert inbox.claim(connection, message, consumer="digests", digest="d1") is True
        with connection.transaction():
            assert inbox.claim(connection, message, consumer="digests", digest="d1") is False
            assert inbox.claim(connection, message, consumer="digests") is False  # unknown
            with pytest.raises(ConflictingCopyError, match=f"event id {message}: a copy") as error:
                inbox.claim(connection, message, consumer="digests", digest="d2")
            assert error.value.consumer == "digests" and error.value.message_id == message
            # Nothing failed in the database: the transaction goes on.
            assert inbox.claim(connection, message, consumer="elsewhere", digest="d2") is True
    assert claimed_digest(database, "digests", message) == "d1"


async def test_async_inbox_claims_with_digests(
    database: ScratchDatabase, async_engine: AsyncEngine
) -> None:
    inbox, message = AsyncInbox(), str(uuid.uuid4())
    async with AsyncSession(async_engine) as session, session.begin():
        assert await inbox.claim(session, message, consumer="digests", digest="d1") is True
    async with await psycopg.AsyncConnection.connect(database.conninfo) as connection:
        async with connection.transaction():
            assert await inbox.claim(connection, message, consumer="digests", digest="d1") is False
            with pytest.raises(ConflictingCopyError):
                await inbox.claim(connection, message, consumer="digests", digest="d2")


def test_a_consumer_role_keeps_and_reads_its_claims_digests(database: ScratchDatabase) -> None:
    """``grant_consumer``'s table privileges cover the column; row-level security filters
    rows: the duplicate path's read sees the role's own claims."""
    name, password = make_role(database, "digest_consumer")
    consumer = f"ledger-{uuid.uuid4().hex[:8]}"
    engine = sa.create_engine(database.url)
    try:
        with engine.begin() as connection:
            outbox_migrations.grant_consumer(connection, name, consumers=[consumer])
        with connect_as(database, name, password) as connection, connection.transaction():
            assert Inbox().claim(connection, "m-1", consumer=consumer, digest="d1") is True
            assert Inbox().claim(connection, "m-1", consumer=consumer, digest="d1") is False
            with pytest.raises(ConflictingCopyError):
                Inbox().claim(connection, "m-1", consumer=consumer, digest="d2")
    finally:
        engine.dispose()
        drop_role(database, name)


# -- outbox_0009 --------------------------------------------------------------------------------


def inbox_columns(database: ScratchDatabase) -> dict[str, tuple[str, str]]:
    with database.connect() as connection:
        return {
            name: (kind, nullable)
            for name, kind, nullable in connection.execute(
                "SELECT column_name, data_type, is_nullable FROM information_schema.columns "
                "WHERE table_schema = 'outbox' AND table_name = 'outbox_inbox'"
            )
        }


@pytest.fixture
def engine_of_empty(empty_database: ScratchDatabase) -> Iterator[sa.Engine]:
    engine = sa.create_engine(empty_database.url)
    yield engine
    engine.dispose()


def test_the_migration_adds_and_drops_the_digest(
    empty_database: ScratchDatabase, engine_of_empty: sa.Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    database, engine = empty_database, engine_of_empty
    with engine.begin() as connection:
        outbox_migrations.upgrade(connection, "outbox_0008")
    assert "digest" not in inbox_columns(database)
    old = uuid.uuid4()
    with database.connect() as connection, connection.transaction():
        assert Inbox().claim(connection, old, consumer="shop") is True  # before: no digest

    # The consumer on an inbox without the column stops, and dead-letters nothing.
    with pytest.raises(ConfigurationError, match="outbox_0009"):
        consume(database.url, "shop", [[record(uuid.uuid4(), "{}", offset=0)]], monkeypatch)

    with engine.begin() as connection:
        outbox_migrations.upgrade(connection, "outbox_0009")
    assert inbox_columns(database)["digest"] == ("text", "YES")
    assert claimed_digest(database, "shop", old) is None, "claims of before: content unknown"
    with database.connect() as connection, connection.transaction():
        assert Inbox().claim(connection, old, consumer="shop", digest="d1") is False
    consumer, handled = consume(
        database.url,
        "shop",
        [[record(old, "{}", offset=0), record(uuid.uuid4(), "{}", offset=1)]],
        monkeypatch,
    )
    assert (consumer.stats.duplicates, consumer.stats.applied, len(handled)) == (1, 1, 1)

    with engine.begin() as connection:
        outbox_migrations.downgrade(connection, "outbox_0008")
    assert "digest" not in inbox_columns(database)
    with database.connect() as connection, connection.transaction():  # claims go on without
        assert Inbox().claim(connection, old, consumer="shop") is False
        assert Inbox().claim(connection, uuid.uuid4(), consumer="shop") is True
    with engine.begin() as connection:
        outbox_migrations.upgrade(connection)
    assert "digest" in inbox_columns(database)
