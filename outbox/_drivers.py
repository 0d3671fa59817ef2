"""The I/O edge: run the core's statements on whatever transaction object the caller holds.

Supported, sync: SQLAlchemy ``Session`` and ``Connection``, psycopg ``Connection``.
Supported, async: SQLAlchemy ``AsyncSession`` and ``AsyncConnection``, psycopg
``AsyncConnection``. SQLAlchemy must use the psycopg 3 driver (``postgresql+psycopg://``, for
``create_engine`` and ``create_async_engine`` alike): SQLAlchemy reads a plain
``postgresql://`` as psycopg2, which :func:`sqlalchemy_url` maps to psycopg 3; psycopg2,
asyncpg and the other drivers are refused.

Before anything runs, the transaction is checked: an autocommit connection, or one with no
transaction open, is refused, because an event written there would be atomic with nothing.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator
from functools import lru_cache
from typing import Any, TypeVar

import psycopg
from psycopg import pq
from sqlalchemy import TextClause, text
from sqlalchemy.engine import Connection as SAConnection
from sqlalchemy.ext.asyncio import AsyncConnection as SAAsyncConnection
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

from outbox.core.errors import (
    ConfigurationError,
    TransactionRequiredError,
    UnsupportedTransactionError,
)
from outbox.core.protocol import Rows
from outbox.core.statements import Result, Statement, to_named_style

__all__ = [
    "async_executor",
    "check_psycopg_transaction",
    "drive",
    "drive_async",
    "sqlalchemy_url",
    "still_in_transaction",
    "sync_executor",
]

_SYNC_TYPES = (Session, SAConnection, psycopg.Connection)
_ASYNC_TYPES = (AsyncSession, SAAsyncConnection, psycopg.AsyncConnection)
SyncExecutor = Callable[[Statement], Rows]
AsyncExecutor = Callable[[Statement], Awaitable[Rows]]
T = TypeVar("T")

_HOW_TO_BEGIN = (
    "open a transaction first and publish inside it: `with session.begin():` (SQLAlchemy "
    "Session), `with connection.begin():` (SQLAlchemy Connection) or "
    "`with conn.transaction():` (psycopg)"
)
_HOW_TO_BEGIN_ASYNC = _HOW_TO_BEGIN.replace("`with", "`async with")

# SQLAlchemy's names for psycopg 3 (``psycopg_async`` is its explicit async twin); the
# driverless schemes it would read as psycopg2 (``postgres://`` it does not read at all).
_PSYCOPG_DRIVERS = ("postgresql+psycopg", "postgresql+psycopg_async")
_DRIVERLESS = ("postgresql", "postgres")
_USE_PSYCOPG = (
    "use postgresql+psycopg://user:password@host:5432/db (psycopg 3, for create_engine and "
    "create_async_engine alike), or pass the URL through outbox.sqlalchemy_url()"
)


def sqlalchemy_url(url: str) -> str:
    """``url`` as a SQLAlchemy URL on psycopg 3, the one driver the SDK runs on.

    ``postgresql://`` (which SQLAlchemy reads as psycopg2) and ``postgres://`` (which it does
    not read) become ``postgresql+psycopg://``; a psycopg 3 URL is returned unchanged.
    Another driver (psycopg2, asyncpg, pg8000...) or another database is refused with
    :class:`ConfigurationError`, whose message names the fix and never the password.
    """
    scheme, separator, rest = url.partition("://")
    if separator and scheme.lower() in _PSYCOPG_DRIVERS:
        return url
    if separator and scheme.lower() in _DRIVERLESS:
        return f"postgresql+psycopg://{rest}"
    if separator and scheme.lower().startswith(("postgresql+", "postgres+")):
        driver = scheme.partition("+")[2]
        raise ConfigurationError(
            f"the database URL names the driver {driver!r}: the outbox SDK runs on psycopg 3 "
            f"only; {_USE_PSYCOPG}"
        )
    raise ConfigurationError(f"the database URL is not a PostgreSQL URL: {_USE_PSYCOPG}")


def drive(operation: Generator[Statement, Rows, T], execute: SyncExecutor) -> T:
    """Run a core operation to its end, executing each statement it yields. A statement's
    error is thrown into the operation, which may say what it means (or let it through)."""
    try:
        statement = next(operation)
        while True:
            try:
                rows = execute(statement)
            except Exception as error:
                statement = operation.throw(error)
                continue
            statement = operation.send(rows)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]


async def drive_async(operation: Generator[Statement, Rows, T], execute: AsyncExecutor) -> T:
    """The async twin of :func:`drive`."""
    try:
        statement = next(operation)
        while True:
            try:
                rows = await execute(statement)
            except Exception as error:
                statement = operation.throw(error)
                continue
            statement = operation.send(rows)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]


@lru_cache(maxsize=128)
def _text_clause(sql: str) -> TextClause:
    return text(to_named_style(sql))


def sync_executor(transaction: object) -> SyncExecutor:
    """Check ``transaction`` and return a function that runs statements in it."""
    if isinstance(transaction, psycopg.Connection):
        check_psycopg_transaction(transaction)
        return lambda statement: _run_psycopg(transaction, statement)
    if isinstance(transaction, Session):
        if not transaction.in_transaction():
            raise TransactionRequiredError(f"the Session is not in a transaction: {_HOW_TO_BEGIN}")
        _check_sqlalchemy_driver(transaction.connection().connection.driver_connection)
        return lambda statement: _sqlalchemy_rows(
            transaction.execute(_text_clause(statement.sql), statement.params), statement
        )
    if isinstance(transaction, SAConnection):
        if not transaction.in_transaction():
            raise TransactionRequiredError(
                f"the Connection is not in a transaction: {_HOW_TO_BEGIN}"
            )
        _check_sqlalchemy_driver(transaction.connection.driver_connection)
        return lambda statement: _sqlalchemy_rows(
            transaction.execute(_text_clause(statement.sql), statement.params), statement
        )
    if isinstance(transaction, _ASYNC_TYPES):
        raise UnsupportedTransactionError(
            f"{type(transaction).__name__} is asynchronous: use AsyncOutbox / AsyncInbox "
            "(or apublish, apublish_many, aclaim) with it"
        )
    raise UnsupportedTransactionError(_unsupported(transaction))


async def async_executor(transaction: object) -> AsyncExecutor:
    """The async twin of :func:`sync_executor`."""
    if isinstance(transaction, psycopg.AsyncConnection):
        check_psycopg_transaction(transaction)

        async def run_psycopg(statement: Statement) -> Rows:
            cursor = await transaction.execute(statement.sql, statement.params)
            if statement.result is Result.ROWS:
                return await cursor.fetchall()
            return _rowcount(cursor.rowcount, statement)

        return run_psycopg
    if isinstance(transaction, AsyncSession):
        if not transaction.in_transaction():
            raise TransactionRequiredError(
                f"the AsyncSession is not in a transaction: {_HOW_TO_BEGIN_ASYNC}"
            )
        connection = await transaction.connection()
        _check_sqlalchemy_driver(connection.sync_connection.connection.driver_connection)  # type: ignore[union-attr]

        async def run_session(statement: Statement) -> Rows:
            result = await transaction.execute(_text_clause(statement.sql), statement.params)
            return _sqlalchemy_rows(result, statement)

        return run_session
    if isinstance(transaction, SAAsyncConnection):
        if not transaction.in_transaction():
            raise TransactionRequiredError(
                f"the AsyncConnection is not in a transaction: {_HOW_TO_BEGIN_ASYNC}"
            )
        _check_sqlalchemy_driver(transaction.sync_connection.connection.driver_connection)  # type: ignore[union-attr]

        async def run_connection(statement: Statement) -> Rows:
            result = await transaction.execute(_text_clause(statement.sql), statement.params)
            return _sqlalchemy_rows(result, statement)

        return run_connection
    if isinstance(transaction, _SYNC_TYPES):
        raise UnsupportedTransactionError(
            f"{type(transaction).__name__} is synchronous: use Outbox / Inbox "
            "(or publish, publish_many, claim) with it"
        )
    raise UnsupportedTransactionError(_unsupported(transaction))


def _run_psycopg(connection: psycopg.Connection[Any], statement: Statement) -> Rows:
    cursor = connection.execute(statement.sql, statement.params)
    if statement.result is Result.ROWS:
        return cursor.fetchall()
    return _rowcount(cursor.rowcount, statement)


def _sqlalchemy_rows(result: Any, statement: Statement) -> Rows:
    if statement.result is Result.ROWS:
        return [tuple(row) for row in result.all()]
    return _rowcount(result.rowcount, statement)


def _rowcount(rowcount: int, statement: Statement) -> Rows:
    return [(rowcount,)] if statement.result is Result.ROWCOUNT else []


def check_psycopg_transaction(
    connection: psycopg.Connection[Any] | psycopg.AsyncConnection[Any],
) -> None:
    # libpq's own status (an int): ``connection.info`` builds an object and an enum per call,
    # and this runs before every publish.
    status = connection.pgconn.transaction_status
    if status == pq.TransactionStatus.INTRANS:
        return
    in_pipeline = connection.pgconn.pipeline_status != pq.PipelineStatus.OFF
    if status == pq.TransactionStatus.ACTIVE and in_pipeline and not connection.autocommit:
        return  # statements queued in a pipeline; the transaction began with the first of them
    if status == pq.TransactionStatus.INERROR:
        raise TransactionRequiredError(
            "the psycopg connection's transaction has failed: roll it back and start again"
        )
    if connection.autocommit:
        raise TransactionRequiredError(
            "the psycopg connection is in autocommit mode, so the event would be committed on "
            f"its own: {_HOW_TO_BEGIN}"
        )
    raise TransactionRequiredError(
        f"the psycopg connection is not in a transaction: {_HOW_TO_BEGIN}"
    )


def still_in_transaction(transaction: object) -> bool:
    """Whether ``transaction`` is still inside a transaction (after its context has ended).

    True means the context was a savepoint or a block inside an outer transaction, so what
    it wrote is not committed yet.
    """
    if isinstance(transaction, psycopg.Connection | psycopg.AsyncConnection):
        return not transaction.closed and transaction.info.transaction_status in (
            pq.TransactionStatus.INTRANS,
            pq.TransactionStatus.INERROR,
            pq.TransactionStatus.ACTIVE,
        )
    if isinstance(transaction, Session | SAConnection | AsyncSession | SAAsyncConnection):
        return transaction.in_transaction()
    return False


def _check_sqlalchemy_driver(driver_connection: object | None) -> None:
    if driver_connection is None:
        return
    if not isinstance(driver_connection, psycopg.Connection | psycopg.AsyncConnection):
        driver = type(driver_connection).__module__.split(".")[0]
        raise UnsupportedTransactionError(
            f"the SQLAlchemy engine uses the driver {driver} (a plain postgresql:// URL means "
            f"psycopg2 to SQLAlchemy); the outbox SDK runs on psycopg 3: {_USE_PSYCOPG}"
        )
    if driver_connection.autocommit:
        raise TransactionRequiredError(
            "the SQLAlchemy connection uses isolation_level='AUTOCOMMIT', so the event would "
            "be committed on its own: use a transactional engine or connection"
        )


def _unsupported(transaction: object) -> str:
    return (
        f"cannot publish through a {type(transaction).__module__}.{type(transaction).__name__}: "
        "pass a SQLAlchemy Session, Connection, AsyncSession or AsyncConnection, or a psycopg "
        "Connection or AsyncConnection, inside an open transaction"
    )
