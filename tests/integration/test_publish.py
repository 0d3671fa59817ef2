"""Atomicity of a business row and its events, for every kind of transaction."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, create_async_engine
from sqlalchemy.orm import Session

from outbox import (
    AsyncOutbox,
    Event,
    EventError,
    Outbox,
    TransactionRequiredError,
    UnsupportedTransactionError,
)
from tests.fix_postgres import ScratchDatabase
from tests.integration.kinds import ASYNC_KINDS, SYNC_KINDS, async_openers, sync_openers

pytestmark = pytest.mark.timeout(60)


class Boom(Exception):
    pass


@pytest.fixture(scope="module", autouse=True)
def app_orders(database: ScratchDatabase) -> None:
    with database.connect() as connection:
        connection.execute(
            "CREATE TABLE IF NOT EXISTS app_orders (id serial PRIMARY KEY, note text NOT NULL)"
        )


def counts(database: ScratchDatabase, note: str) -> tuple[int, int]:
    """(orders with this note, outbox events whose aggregate id is this note)."""
    with database.connect() as connection:
        orders = connection.execute(
            "SELECT count(*) FROM app_orders WHERE note = %s", (note,)
        ).fetchone()
        events = connection.execute(
            "SELECT count(*) FROM outbox.outbox WHERE aggregateid = %s", (note,)
        ).fetchone()
    assert orders is not None and events is not None
    return orders[0], events[0]


def order_placed(note: str, number: int = 0) -> Event:
    return Event("order", note, "OrderPlaced", {"note": note, "n": number})


@pytest.fixture(params=SYNC_KINDS)
def open_sync(request: pytest.FixtureRequest, database: ScratchDatabase, engine: sa.Engine) -> Any:
    return sync_openers(database.conninfo, engine)[request.param]


@pytest.fixture(params=ASYNC_KINDS)
def open_async(
    request: pytest.FixtureRequest, database: ScratchDatabase, async_engine: AsyncEngine
) -> Any:
    return async_openers(database.conninfo, async_engine)[request.param]


def test_commit_writes_business_row_and_event(open_sync: Any, database: ScratchDatabase) -> None:
    note = uuid.uuid4().hex
    with open_sync(note) as transaction:
        result = Outbox().publish(transaction, order_placed(note))
    assert result.duplicate is False
    assert counts(database, note) == (1, 1)
    with database.connect() as connection:
        row = connection.execute(
            "SELECT id, aggregatetype, type, payload, headers, position IS NOT NULL "
            "FROM outbox.outbox WHERE aggregateid = %s",
            (note,),
        ).fetchone()
    assert row == (result.event_id, "order", "OrderPlaced", {"note": note, "n": 0}, {}, True)


def test_exception_inside_transaction_writes_neither(
    open_sync: Any, database: ScratchDatabase
) -> None:
    note = uuid.uuid4().hex
    with pytest.raises(Boom), open_sync(note) as transaction:
        Outbox().publish(transaction, order_placed(note))
        raise Boom
    assert counts(database, note) == (0, 0)


def test_rollback_writes_neither(database: ScratchDatabase, engine: sa.Engine) -> None:
    note = uuid.uuid4().hex
    with psycopg.connect(database.conninfo) as connection:
        with connection.transaction():
            connection.execute("INSERT INTO app_orders (note) VALUES (%s)", (note,))
            Outbox().publish(connection, order_placed(note))
            raise psycopg.Rollback
    with Session(engine) as session:
        session.begin()
        session.execute(sa.text("INSERT INTO app_orders (note) VALUES (:n)"), {"n": note})
        Outbox().publish_many(session, [order_placed(note, i) for i in range(3)])
        session.rollback()
    assert counts(database, note) == (0, 0)


async def test_async_commit_writes_business_row_and_event(
    open_async: Any, database: ScratchDatabase
) -> None:
    note = uuid.uuid4().hex
    async with open_async(note) as transaction:
        results = await AsyncOutbox().publish_many(
            transaction, [order_placed(note, i) for i in range(3)]
        )
    assert [r.duplicate for r in results] == [False] * 3
    assert counts(database, note) == (1, 3)


async def test_async_exception_inside_transaction_writes_neither(
    open_async: Any, database: ScratchDatabase
) -> None:
    note = uuid.uuid4().hex
    with pytest.raises(Boom):
        async with open_async(note) as transaction:
            await AsyncOutbox().publish(transaction, order_placed(note))
            raise Boom
    assert counts(database, note) == (0, 0)


# --- refused transactions ---------------------------------------------------------------


@pytest.fixture
def autocommit_engine(database: ScratchDatabase) -> Iterator[sa.Engine]:
    engine = sa.create_engine(database.url, isolation_level="AUTOCOMMIT")
    yield engine
    engine.dispose()


def test_autocommit_is_refused(database: ScratchDatabase, autocommit_engine: sa.Engine) -> None:
    note = uuid.uuid4().hex
    outbox = Outbox()
    with psycopg.connect(database.conninfo, autocommit=True) as connection:
        with pytest.raises(TransactionRequiredError, match="autocommit"):
            outbox.publish(connection, order_placed(note))
    with autocommit_engine.connect() as connection:
        connection.execute(sa.text("SELECT 1"))
        with pytest.raises(TransactionRequiredError, match="AUTOCOMMIT"):
            outbox.publish(connection, order_placed(note))
    with Session(autocommit_engine) as session, session.begin():
        with pytest.raises(TransactionRequiredError, match="AUTOCOMMIT"):
            outbox.publish(session, order_placed(note))
    assert counts(database, note) == (0, 0)


def test_autocommit_connection_inside_an_explicit_transaction_is_accepted(
    database: ScratchDatabase,
) -> None:
    """psycopg's `with conn.transaction()` on an autocommit connection is a real transaction."""
    note = uuid.uuid4().hex
    with psycopg.connect(database.conninfo, autocommit=True) as connection:
        with connection.transaction():
            connection.execute("INSERT INTO app_orders (note) VALUES (%s)", (note,))
            Outbox().publish(connection, order_placed(note))
            raise psycopg.Rollback
    assert counts(database, note) == (0, 0)


def test_no_open_transaction_is_refused(database: ScratchDatabase, engine: sa.Engine) -> None:
    note = uuid.uuid4().hex
    outbox = Outbox()
    with psycopg.connect(database.conninfo) as connection:
        with pytest.raises(TransactionRequiredError, match="not in a transaction"):
            outbox.publish(connection, order_placed(note))
    with engine.connect() as connection:
        with pytest.raises(TransactionRequiredError, match="not in a transaction"):
            outbox.publish(connection, order_placed(note))
    with Session(engine) as session:
        with pytest.raises(TransactionRequiredError, match="not in a transaction"):
            outbox.publish(session, order_placed(note))
    assert counts(database, note) == (0, 0)


def test_failed_transaction_is_refused(database: ScratchDatabase) -> None:
    with psycopg.connect(database.conninfo) as connection:
        with pytest.raises(psycopg.errors.DivisionByZero):
            connection.execute("SELECT 1/0")
        with pytest.raises(TransactionRequiredError, match="failed"):
            Outbox().publish(connection, order_placed("x"))


async def test_async_refusals(database: ScratchDatabase) -> None:
    note = uuid.uuid4().hex
    outbox = AsyncOutbox()
    async with await psycopg.AsyncConnection.connect(database.conninfo, autocommit=True) as conn:
        with pytest.raises(TransactionRequiredError, match="autocommit"):
            await outbox.publish(conn, order_placed(note))
    engine = create_async_engine(database.url)
    try:
        async with AsyncSession(engine) as session:
            with pytest.raises(TransactionRequiredError, match="not in a transaction"):
                await outbox.publish(session, order_placed(note))
        async with engine.connect() as connection:
            with pytest.raises(TransactionRequiredError, match="not in a transaction"):
                await outbox.publish(connection, order_placed(note))
    finally:
        await engine.dispose()
    assert counts(database, note) == (0, 0)


async def test_sync_and_async_objects_are_not_mixed_up(
    database: ScratchDatabase, engine: sa.Engine
) -> None:
    with psycopg.connect(database.conninfo) as connection, connection.transaction():
        with pytest.raises(UnsupportedTransactionError, match="synchronous"):
            await AsyncOutbox().publish(connection, order_placed("x"))
    async with await psycopg.AsyncConnection.connect(database.conninfo) as conn:
        with pytest.raises(UnsupportedTransactionError, match="asynchronous"):
            Outbox().publish(conn, order_placed("x"))
    with pytest.raises(UnsupportedTransactionError, match="pass a SQLAlchemy Session"):
        Outbox().publish(object(), order_placed("x"))


# --- one statement per batch ------------------------------------------------------------


class CountingCursor(psycopg.Cursor[Any]):
    statements: list[str] = []

    def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:  # type: ignore[override]
        CountingCursor.statements.append(str(query))
        return super().execute(query, params, **kwargs)


def test_publish_many_of_1000_events_is_one_statement(
    database: ScratchDatabase, engine: sa.Engine
) -> None:
    note = uuid.uuid4().hex
    events = [order_placed(note, i) for i in range(1000)]
    with psycopg.connect(database.conninfo, cursor_factory=CountingCursor) as connection:
        with connection.transaction():
            CountingCursor.statements.clear()
            Outbox().publish_many(connection, events)
            assert len(CountingCursor.statements) == 1
            assert CountingCursor.statements[0].lstrip().startswith("INSERT INTO")

    seen: list[str] = []

    def count(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        seen.append(statement)

    sa.event.listen(engine, "before_cursor_execute", count)
    try:
        with Session(engine) as session, session.begin():
            Outbox().publish_many(session, [order_placed(note, i) for i in range(1000)])
    finally:
        sa.event.remove(engine, "before_cursor_execute", count)
    assert len(seen) == 1
    assert counts(database, note) == (0, 2000)


def test_positions_follow_the_order_of_the_batch(database: ScratchDatabase) -> None:
    note = uuid.uuid4().hex
    events = [order_placed(note, i) for i in range(50)]
    with psycopg.connect(database.conninfo) as connection, connection.transaction():
        Outbox().publish_many(connection, events)
    with database.connect() as connection:
        ids = [
            row[0]
            for row in connection.execute(
                "SELECT id FROM outbox.outbox WHERE aggregateid = %s ORDER BY position", (note,)
            )
        ]
    assert ids == [event.event_id for event in events]


def test_pipelined_psycopg_connection_publishes_without_waiting(database: ScratchDatabase) -> None:
    note = uuid.uuid4().hex
    with psycopg.connect(database.conninfo) as connection:
        with connection.pipeline(), connection.transaction():
            connection.execute("INSERT INTO app_orders (note) VALUES (%s)", (note,))
            Outbox().publish(connection, order_placed(note))
    assert counts(database, note) == (1, 1)


def test_lost_connection_before_commit_writes_neither(database: ScratchDatabase) -> None:
    """Postgres ends the session mid-transaction: the commit fails, nothing is half-written."""
    note = uuid.uuid4().hex
    with psycopg.connect(database.conninfo) as connection:
        connection.execute("INSERT INTO app_orders (note) VALUES (%s)", (note,))
        Outbox().publish(connection, order_placed(note))
        with database.connect(autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (connection.info.backend_pid,))
        with pytest.raises(psycopg.OperationalError):
            connection.commit()
    assert counts(database, note) == (0, 0)


def test_headers_and_traceparent_are_stored(database: ScratchDatabase) -> None:
    note = uuid.uuid4().hex
    traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    event = Event(
        "order", note, "OrderPlaced", {}, headers={"tenant": "acme"}, traceparent=traceparent
    )
    with psycopg.connect(database.conninfo) as connection, connection.transaction():
        Outbox().publish(connection, event)
    with database.connect() as connection:
        row = connection.execute(
            "SELECT headers, traceparent FROM outbox.outbox WHERE id = %s", (event.event_id,)
        ).fetchone()
    assert row == ({"tenant": "acme"}, traceparent)


# --- events attached to the caller's own statement ----------------------------------------


def test_execute_attaches_events_to_the_callers_statement(database: ScratchDatabase) -> None:
    note = uuid.uuid4().hex
    outbox = Outbox()
    events = [order_placed(note, i) for i in range(3)]
    with psycopg.connect(database.conninfo, cursor_factory=CountingCursor) as connection:
        with connection.transaction():
            CountingCursor.statements.clear()
            cursor = outbox.execute(
                connection,
                "INSERT INTO app_orders (note) VALUES (%s) RETURNING note",
                (note,),
                events=events,
            )
            assert cursor.fetchall() == [(note,)], "the cursor holds the caller's results"
            assert len(CountingCursor.statements) == 1
        with connection.transaction():
            outbox.execute(
                connection,
                "WITH n AS (SELECT %(note)s AS note) INSERT INTO app_orders (note) "
                "SELECT note FROM n",
                {"note": note},
                events=[order_placed(note, 3)],
            )
    assert counts(database, note) == (2, 4)
    with database.connect() as connection:
        ids = [
            row[0]
            for row in connection.execute(
                "SELECT id FROM outbox.outbox WHERE aggregateid = %s ORDER BY position", (note,)
            )
        ]
    assert ids[:3] == [event.event_id for event in events]


def test_execute_rolls_back_with_the_callers_statement(database: ScratchDatabase) -> None:
    note = uuid.uuid4().hex
    with psycopg.connect(database.conninfo) as connection:
        with pytest.raises(psycopg.errors.NotNullViolation), connection.transaction():
            Outbox().execute(
                connection,
                "INSERT INTO app_orders (note) VALUES (%s)",
                (None,),
                events=[order_placed(note)],
            )
    assert counts(database, note) == (0, 0)


def test_one_event_is_written_alike_by_execute_and_publish(database: ScratchDatabase) -> None:
    note = uuid.uuid4().hex
    traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"

    def event(n: int) -> Event:
        return Event(
            "order",
            note,
            "Placed",
            {"n": n, "é": 'a"b'},
            headers={"t": "x"},
            traceparent=traceparent,
        )

    attached, published, named = event(1), event(2), event(3)
    outbox = Outbox()
    with psycopg.connect(database.conninfo) as connection:
        with connection.transaction():
            outbox.execute(
                connection, "INSERT INTO app_orders (note) VALUES (%s)", (note,), events=[attached]
            )
            outbox.publish(connection, published)
            outbox.execute(
                connection,
                "INSERT INTO app_orders (note) VALUES (%(note)s)",
                {"note": note},
                events=[named],
            )
        with pytest.raises(EventError, match="outbox_payload"), connection.transaction():
            outbox.execute(
                connection, "SELECT %(outbox_payload)s", {"outbox_payload": 1}, events=[event(4)]
            )
    with database.connect() as connection:
        rows = connection.execute(
            "SELECT id, type, payload, headers, traceparent FROM outbox.outbox "
            "WHERE aggregateid = %s ORDER BY position",
            (note,),
        ).fetchall()
    expected = [
        (e.event_id, "Placed", e.payload, {"t": "x"}, traceparent)
        for e in (attached, published, named)
    ]
    assert rows == expected
    assert counts(database, note) == (2, 3)


async def test_async_execute_and_its_refusals(database: ScratchDatabase, engine: sa.Engine) -> None:
    note = uuid.uuid4().hex
    outbox = AsyncOutbox()
    async with await psycopg.AsyncConnection.connect(database.conninfo) as connection:
        async with connection.transaction():
            await outbox.execute(
                connection,
                "INSERT INTO app_orders (note) VALUES (%s)",
                (note,),
                events=[order_placed(note)],
            )
        with pytest.raises(EventError, match="dedup_key"):
            async with connection.transaction():
                await outbox.execute(
                    connection,
                    "SELECT 1",
                    events=[Event("order", note, "Paid", {}, dedup_key="k")],
                )
    with psycopg.connect(database.conninfo, autocommit=True) as connection:
        with pytest.raises(TransactionRequiredError):
            Outbox().execute(connection, "SELECT 1", events=[order_placed(note)])
    with Session(engine) as session, session.begin():
        with pytest.raises(UnsupportedTransactionError, match="publish"):
            Outbox().execute(session, "SELECT 1", events=[order_placed(note)])  # type: ignore[arg-type]
    assert counts(database, note) == (1, 1)
