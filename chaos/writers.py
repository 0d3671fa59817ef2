"""The chaos writers: threads committing and rolling back business rows with their events
through the SDK, with psycopg and SQLAlchemy, sync and async, and recording each event's fate
in the ground truth (:mod:`chaos.truth`).

A driver runs a transaction's steps (:mod:`chaos.plans`) on its connection or session, then
commits or rolls back. Each writer reaches PostgreSQL through a TCP proxy of its own. Some
commits race with a kill, a moment after the COMMIT is sent: a side connection terminates
the writer's backend (``pg_terminate_backend``), or the proxy drops the writer's connection
(the COMMIT may have reached the server, its answer never comes back). The client then gets
an error for a transaction that may have committed: its events are *unknown*. A failure
before the COMMIT is sent means the transaction never committed (*aborted*). On any database
error the writer drops its connection, pauses, and goes on with a new one, as an application
would while PostgreSQL restarts.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import threading
import time
from typing import Any, Literal

import psycopg
from sqlalchemy import create_engine
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session

from chaos.plans import Ending, Plan, Publish, Transaction, account_transaction, order_transaction
from chaos.truth import GroundTruth, Outcome
from outbox import AsyncOutbox, Event, Outbox, OutboxSettings
from tests.fix_proxy import TcpProxy

__all__ = ["FLAVOURS", "PATTERNS", "Assassin", "Writer"]

Flavour = Literal["psycopg", "psycopg-async", "sqlalchemy", "sqlalchemy-async"]
FLAVOURS: tuple[Flavour, ...] = ("psycopg", "psycopg-async", "sqlalchemy", "sqlalchemy-async")
Pattern = Literal["orders", "accounts"]
PATTERNS: tuple[Pattern, ...] = ("orders", "accounts")
EXPECTED_ERRORS = (psycopg.Error, SQLAlchemyError, OSError)
"""What a database going away, a killed backend or a deadlock raises: the writer goes on."""

ROLLBACK_FRACTION = 0.08
KILL_FRACTION = 0.02
KILL_DELAY_SECONDS = (0.0, 0.003)  # after the COMMIT is sent: about as long as a commit takes


class Assassin:
    """Terminates writers' backends from a side connection of its own."""

    def __init__(self, conninfo: str) -> None:
        self._conninfo = conninfo
        self._lock = threading.Lock()
        self._connection: psycopg.Connection[Any] | None = None
        self.attempts = 0

    def terminate(self, backend_pid: int) -> None:
        with self._lock:
            self.attempts += 1
            try:
                if self._connection is None or self._connection.closed:
                    self._connection = psycopg.connect(
                        self._conninfo, autocommit=True, connect_timeout=3
                    )
                self._connection.execute("SELECT pg_terminate_backend(%s)", (backend_pid,))
            except psycopg.Error:
                self._connection = None  # PostgreSQL is down: the commit fails on its own

    def close(self) -> None:
        with self._lock:
            if self._connection is not None:
                self._connection.close()


def _rows(result: Any) -> list[tuple[Any, ...]]:
    return [tuple(row) for row in result.fetchall()] if result.description else []


def _sa_rows(result: Any) -> list[tuple[Any, ...]]:
    return [tuple(row) for row in result.fetchall()] if result.returns_rows else []


class _PsycopgSync:
    def __init__(self, conninfo: str, url: str) -> None:
        self._conninfo = conninfo
        self._connection: psycopg.Connection[Any] | None = None
        self._outbox = Outbox()

    def _open(self) -> psycopg.Connection[Any]:
        if self._connection is None or self._connection.closed:
            self._connection = psycopg.connect(self._conninfo, connect_timeout=3)
        return self._connection

    def step(self, step: Any) -> list[tuple[Any, ...]]:
        if isinstance(step, Publish):
            _publish(self._outbox, self._open(), step.events)
            return []
        return _rows(self._open().execute(step.sql, step.params))

    def backend_pid(self) -> int:
        return self._open().info.backend_pid

    def end(self, commit: bool) -> None:
        connection = self._open()
        connection.commit() if commit else connection.rollback()

    def discard(self) -> None:
        if self._connection is not None:
            with contextlib.suppress(*EXPECTED_ERRORS):
                self._connection.close()
        self._connection = None

    def close(self) -> None:
        self.discard()


class _SqlAlchemySync:
    def __init__(self, conninfo: str, url: str) -> None:
        self._engine = create_engine(url, pool_size=1, max_overflow=0, pool_pre_ping=True)
        self._session: Session | None = None

    def _open(self) -> Session:
        if self._session is None:
            self._session = Session(self._engine)
        return self._session

    def step(self, step: Any) -> list[tuple[Any, ...]]:
        session = self._open()
        if isinstance(step, Publish):
            _publish(Outbox(), session, step.events)
            return []
        return _sa_rows(session.connection().exec_driver_sql(step.sql, step.params))

    def backend_pid(self) -> int:
        driver = self._open().connection().connection.driver_connection
        assert isinstance(driver, psycopg.Connection)
        return driver.info.backend_pid

    def end(self, commit: bool) -> None:
        session = self._open()
        session.commit() if commit else session.rollback()

    def discard(self) -> None:
        if self._session is not None:
            with contextlib.suppress(*EXPECTED_ERRORS):
                self._session.invalidate()
            self._session.close()
        self._session = None

    def close(self) -> None:
        self.discard()
        self._engine.dispose()


class _PsycopgAsync:
    def __init__(self, conninfo: str, url: str) -> None:
        self._conninfo = conninfo
        self._connection: psycopg.AsyncConnection[Any] | None = None
        self._outbox = AsyncOutbox()

    async def _open(self) -> psycopg.AsyncConnection[Any]:
        if self._connection is None or self._connection.closed:
            self._connection = await psycopg.AsyncConnection.connect(
                self._conninfo, connect_timeout=3
            )
        return self._connection

    async def step(self, step: Any) -> list[tuple[Any, ...]]:
        connection = await self._open()
        if isinstance(step, Publish):
            await _apublish(self._outbox, connection, step.events)
            return []
        cursor = await connection.execute(step.sql, step.params)
        return [tuple(row) for row in await cursor.fetchall()] if cursor.description else []

    async def backend_pid(self) -> int:
        return (await self._open()).info.backend_pid

    async def end(self, commit: bool) -> None:
        connection = await self._open()
        await (connection.commit() if commit else connection.rollback())

    async def discard(self) -> None:
        if self._connection is not None:
            with contextlib.suppress(*EXPECTED_ERRORS):
                await self._connection.close()
        self._connection = None

    async def close(self) -> None:
        await self.discard()


class _SqlAlchemyAsync:
    def __init__(self, conninfo: str, url: str) -> None:
        self._engine = create_async_engine(url, pool_size=1, max_overflow=0, pool_pre_ping=True)
        self._session: AsyncSession | None = None

    def _open(self) -> AsyncSession:
        if self._session is None:
            self._session = AsyncSession(self._engine)
        return self._session

    async def step(self, step: Any) -> list[tuple[Any, ...]]:
        session = self._open()
        if isinstance(step, Publish):
            await _apublish(AsyncOutbox(), session, step.events)
            return []
        connection = await session.connection()
        return _sa_rows(await connection.exec_driver_sql(step.sql, step.params))

    async def backend_pid(self) -> int:
        connection = await self._open().connection()
        raw = await connection.get_raw_connection()
        driver = raw.driver_connection
        assert isinstance(driver, psycopg.AsyncConnection)
        return driver.info.backend_pid

    async def end(self, commit: bool) -> None:
        session = self._open()
        await (session.commit() if commit else session.rollback())

    async def discard(self) -> None:
        if self._session is not None:
            with contextlib.suppress(*EXPECTED_ERRORS):
                await self._session.invalidate()
            await self._session.close()
        self._session = None

    async def close(self) -> None:
        await self.discard()
        await self._engine.dispose()


def _publish(outbox: Outbox, transaction: object, events: list[Event]) -> None:
    """One event through ``publish``, several through ``publish_many`` (one statement)."""
    if len(events) == 1:
        outbox.publish(transaction, events[0])
    else:
        outbox.publish_many(transaction, events)


async def _apublish(outbox: AsyncOutbox, transaction: object, events: list[Event]) -> None:
    if len(events) == 1:
        await outbox.publish(transaction, events[0])
    else:
        await outbox.publish_many(transaction, events)


class Writer(threading.Thread):
    """One writer: ``flavour`` (driver), ``pattern`` (own orders or shared accounts),
    ``transactions_per_second``, until ``stop`` is set. Its choices follow ``seed``."""

    def __init__(
        self,
        flavour: Flavour,
        pattern: Pattern,
        *,
        conninfo: str,
        url: str,
        truth: GroundTruth,
        assassin: Assassin,
        proxy: TcpProxy,
        seed: int,
        transactions_per_second: float,
        stop: threading.Event,
    ) -> None:
        super().__init__(name=f"{pattern}-{flavour}", daemon=True)
        self.flavour = flavour
        self.pattern = pattern
        self._conninfo = conninfo
        self._url = url
        self._truth = truth
        self._assassin = assassin
        self._proxy = proxy
        self.kills: dict[str, int] = {"terminate": 0, "drop": 0}
        """Commits raced with a kill, by how."""
        self._rng = random.Random(f"{seed}:{self.name}")  # noqa: S311 - replayable choices
        self._tick = 1.0 / transactions_per_second
        self._stop_event = stop
        self._tables = OutboxSettings().tables
        self.failures = 0
        self.error: BaseException | None = None
        """An error no database fault explains (a bug): the run reports it and fails."""

    def _next(self) -> tuple[Transaction, bool]:
        """The next transaction, and whether its commit races with a kill."""
        make = order_transaction if self.pattern == "orders" else account_transaction
        roll_back = self._rng.random() < ROLLBACK_FRACTION
        transaction = make(self._rng, self.name, self._tables, roll_back=roll_back)
        return transaction, not roll_back and self._rng.random() < KILL_FRACTION

    def _killer(self, backend_pid: int) -> threading.Thread:
        """A thread that kills this writer's connection a moment after it starts: its
        backend terminated, or its TCP connection dropped by the proxy."""
        after = self._rng.uniform(*KILL_DELAY_SECONDS)
        how = self._rng.choice(("terminate", "drop"))
        self.kills[how] += 1

        def kill() -> None:
            time.sleep(after)  # the race itself: how long after the COMMIT was sent
            if how == "drop":
                self._proxy.drop()
            else:
                self._assassin.terminate(backend_pid)

        return threading.Thread(target=kill, name=f"{self.name}-killer", daemon=True)

    def _pace(self, started: float) -> None:
        self._stop_event.wait(max(0.0, self._tick - (time.monotonic() - started)))

    def _failed(self, transaction: Transaction, ending: Ending | None, commit_sent: bool) -> None:
        written = ending.written if ending is not None else transaction.unwritten()
        if ending is not None and not ending.commit:
            outcome = Outcome.ROLLED_BACK  # the rollback itself failed: never committed
        else:
            outcome = Outcome.UNKNOWN if commit_sent else Outcome.ABORTED
        self._truth.record(self.name, outcome, written)
        self.failures += 1

    def _succeeded(self, ending: Ending) -> None:
        outcome = Outcome.COMMITTED if ending.commit else Outcome.ROLLED_BACK
        self._truth.record(self.name, outcome, ending.written)

    def run(self) -> None:
        try:
            if self.flavour.endswith("-async"):
                asyncio.run(self._run_async())
            else:
                self._run_sync()
        except BaseException as error:  # reported by the run, which then fails
            self.error = error

    def _run_sync(self) -> None:
        driver = _PsycopgSync if self.flavour == "psycopg" else _SqlAlchemySync
        session = driver(self._conninfo, self._url)
        try:
            while not self._stop_event.is_set():
                started = time.monotonic()
                transaction, kill = self._next()
                ending: Ending | None = None
                commit_sent = False
                try:
                    ending = _drive(transaction.steps, session.step)
                    if ending.commit and kill:
                        self._killer(session.backend_pid()).start()
                    commit_sent = ending.commit
                    session.end(ending.commit)
                    self._succeeded(ending)
                except EXPECTED_ERRORS:
                    self._failed(transaction, ending, commit_sent)
                    session.discard()
                    self._stop_event.wait(self._rng.uniform(0.1, 0.4))
                self._pace(started)
        finally:
            session.close()

    async def _run_async(self) -> None:
        driver = _PsycopgAsync if self.flavour == "psycopg-async" else _SqlAlchemyAsync
        session = driver(self._conninfo, self._url)
        try:
            while not self._stop_event.is_set():
                started = time.monotonic()
                transaction, kill = self._next()
                ending: Ending | None = None
                commit_sent = False
                try:
                    ending = await _adrive(transaction.steps, session.step)
                    if ending.commit and kill:
                        self._killer(await session.backend_pid()).start()
                    commit_sent = ending.commit
                    await session.end(ending.commit)
                    self._succeeded(ending)
                except EXPECTED_ERRORS:
                    self._failed(transaction, ending, commit_sent)
                    await session.discard()
                    await asyncio.sleep(self._rng.uniform(0.1, 0.4))
                await asyncio.sleep(max(0.0, self._tick - (time.monotonic() - started)))
        finally:
            await session.close()


def _drive(plan: Plan, run: Any) -> Ending:
    answer: list[tuple[Any, ...]] | None = None
    try:
        while True:
            step = plan.send(answer) if answer is not None else next(plan)
            answer = run(step)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]


async def _adrive(plan: Plan, run: Any) -> Ending:
    answer: list[tuple[Any, ...]] | None = None
    try:
        while True:
            step = plan.send(answer) if answer is not None else next(plan)
            answer = await run(step)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
