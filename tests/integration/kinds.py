"""Every kind of transaction the SDK accepts, opened the way an application would.

Each opener is a context manager: it begins a transaction, inserts one business row (an
order with the given note), yields the transaction object, and commits on a clean exit or
rolls back on an exception.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import (
    AbstractAsyncContextManager,
    AbstractContextManager,
    asynccontextmanager,
    contextmanager,
)
from typing import Any

import psycopg
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession
from sqlalchemy.orm import Session

INSERT_ORDER = "INSERT INTO app_orders (note) VALUES (%(note)s)"
INSERT_ORDER_SA = sa.text("INSERT INTO app_orders (note) VALUES (:note)")

SyncOpener = Callable[[str], AbstractContextManager[Any]]
AsyncOpener = Callable[[str], AbstractAsyncContextManager[Any]]


def sync_openers(conninfo: str, engine: sa.Engine) -> dict[str, SyncOpener]:
    @contextmanager
    def psycopg_connection(note: str) -> Iterator[psycopg.Connection]:
        with psycopg.connect(conninfo) as connection, connection.transaction():
            connection.execute(INSERT_ORDER, {"note": note})
            yield connection

    @contextmanager
    def sqlalchemy_connection(note: str) -> Iterator[sa.Connection]:
        with engine.connect() as connection, connection.begin():
            connection.execute(INSERT_ORDER_SA, {"note": note})
            yield connection

    @contextmanager
    def sqlalchemy_session(note: str) -> Iterator[Session]:
        with Session(engine) as session, session.begin():
            session.execute(INSERT_ORDER_SA, {"note": note})
            yield session

    return {
        "psycopg.Connection": psycopg_connection,
        "sqlalchemy.Connection": sqlalchemy_connection,
        "sqlalchemy.Session": sqlalchemy_session,
    }


def async_openers(conninfo: str, engine: AsyncEngine) -> dict[str, AsyncOpener]:
    @asynccontextmanager
    async def psycopg_connection(note: str) -> AsyncIterator[psycopg.AsyncConnection]:
        async with await psycopg.AsyncConnection.connect(conninfo) as connection:
            async with connection.transaction():
                await connection.execute(INSERT_ORDER, {"note": note})
                yield connection

    @asynccontextmanager
    async def sqlalchemy_connection(note: str) -> AsyncIterator[Any]:
        async with engine.connect() as connection, connection.begin():
            await connection.execute(INSERT_ORDER_SA, {"note": note})
            yield connection

    @asynccontextmanager
    async def sqlalchemy_session(note: str) -> AsyncIterator[AsyncSession]:
        async with AsyncSession(engine) as session, session.begin():
            await session.execute(INSERT_ORDER_SA, {"note": note})
            yield session

    return {
        "psycopg.AsyncConnection": psycopg_connection,
        "sqlalchemy.AsyncConnection": sqlalchemy_connection,
        "sqlalchemy.AsyncSession": sqlalchemy_session,
    }


SYNC_KINDS = ["psycopg.Connection", "sqlalchemy.Connection", "sqlalchemy.Session"]
ASYNC_KINDS = ["psycopg.AsyncConnection", "sqlalchemy.AsyncConnection", "sqlalchemy.AsyncSession"]
