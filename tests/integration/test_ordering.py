"""Per-aggregate order: outbox positions of one aggregate follow commit order.

Positions come from a sequence, drawn before commit. Without a mechanism, a transaction that
draws position 10 can commit after one that drew 11, and a relay reading in position order
would emit the aggregate's events out of commit order. The outbox trigger takes a
transaction-long advisory lock per aggregate before drawing the position.

``test_without_the_lock_positions_break_commit_order`` runs the very same interleaving on a
copy of the outbox table without the trigger and shows the order breaking: that is what
``test_positions_follow_commit_order_when_writers_interleave`` would see without it.
Commit order is read from Postgres itself (``track_commit_timestamp``), never guessed.
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections.abc import Iterator

import psycopg
import pytest

from outbox import Event, Outbox, OutboxSettings
from tests.concurrency import run_in_threads
from tests.fix_postgres import ScratchDatabase

pytestmark = pytest.mark.timeout(120)

UNORDERED_TABLE = "outbox_unordered"


@pytest.fixture(scope="module")
def unordered_table(database: ScratchDatabase) -> Iterator[OutboxSettings]:
    """A copy of the outbox with a plain sequence default and no ordering trigger."""
    with database.connect() as connection:
        connection.execute(
            f"CREATE TABLE outbox.{UNORDERED_TABLE} "
            "(LIKE outbox.outbox INCLUDING DEFAULTS INCLUDING CONSTRAINTS)"
        )
        connection.execute(f"CREATE SEQUENCE outbox.{UNORDERED_TABLE}_seq")
        connection.execute(
            f"ALTER TABLE outbox.{UNORDERED_TABLE} ALTER COLUMN position "
            f"SET DEFAULT nextval('outbox.{UNORDERED_TABLE}_seq')"
        )
    yield OutboxSettings(table=UNORDERED_TABLE)
    with database.connect() as connection:
        connection.execute(f"DROP TABLE outbox.{UNORDERED_TABLE}")
        connection.execute(f"DROP SEQUENCE outbox.{UNORDERED_TABLE}_seq")


def rows_by_position(
    database: ScratchDatabase, table: str, aggregate_id: str
) -> list[tuple[str, int, object]]:
    """(event type, position, commit timestamp) of one aggregate's rows, by position."""
    with database.connect() as connection:
        return connection.execute(
            f"SELECT type, position, pg_xact_commit_timestamp(xmin) FROM outbox.{table} "
            "WHERE aggregateid = %s ORDER BY position",
            (aggregate_id,),
        ).fetchall()


def wait_until(condition: object, *, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting until {what}")
        time.sleep(0.01)


def is_waiting_on_a_lock(database: ScratchDatabase, pid: int) -> bool:
    with database.connect() as connection:
        row = connection.execute(
            "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", (pid,)
        ).fetchone()
    return row is not None and row[0] == "Lock"


def interleave_two_writers(database: ScratchDatabase, settings: OutboxSettings) -> str:
    """A publishes first; B publishes while A is open; A commits only once B has committed
    or is blocked. Return the aggregate id both wrote to."""
    outbox = Outbox(settings)
    aggregate_id = uuid.uuid4().hex
    b_pid: list[int] = []
    b_done = threading.Event()
    b_errors: list[BaseException] = []

    def writer_b() -> None:
        try:
            with psycopg.connect(database.conninfo) as b:
                b_pid.append(b.info.backend_pid)
                with b.transaction():
                    outbox.publish(b, Event("order", aggregate_id, "B", {}))
        except BaseException as error:  # reported by the main thread
            b_errors.append(error)
        finally:
            b_done.set()

    with psycopg.connect(database.conninfo) as a, a.transaction():
        outbox.publish(a, Event("order", aggregate_id, "A", {}))
        thread = threading.Thread(target=writer_b)
        thread.start()
        wait_until(
            lambda: b_done.is_set() or (b_pid and is_waiting_on_a_lock(database, b_pid[0])),
            timeout=10,
            what="writer B has committed or waits for A's lock",
        )
    thread.join(timeout=10)
    assert not thread.is_alive() and not b_errors, b_errors
    return aggregate_id


def test_positions_follow_commit_order_when_writers_interleave(
    database: ScratchDatabase,
) -> None:
    aggregate_id = interleave_two_writers(database, OutboxSettings())
    rows = rows_by_position(database, "outbox", aggregate_id)
    assert [row[0] for row in rows] == ["A", "B"]
    assert rows[0][2] <= rows[1][2], "position order must be commit order"


def test_without_the_lock_positions_break_commit_order(
    database: ScratchDatabase, unordered_table: OutboxSettings
) -> None:
    """The same interleaving without the mechanism: B commits first yet has the higher
    position, so ordering by position would emit A before B against commit order."""
    aggregate_id = interleave_two_writers(database, unordered_table)
    rows = rows_by_position(database, UNORDERED_TABLE, aggregate_id)
    assert [row[0] for row in rows] == ["A", "B"]
    assert rows[0][2] > rows[1][2], "without the lock, B committed before A"


def test_concurrent_writers_keep_per_aggregate_order(database: ScratchDatabase) -> None:
    """4 writers, 60 transactions each, 2 aggregates per transaction in random order,
    a random pause inside every transaction: per aggregate, positions follow commits,
    and no two batches deadlock (aggregates are locked in one global order)."""
    outbox = Outbox()
    run = uuid.uuid4().hex[:8]
    aggregates = [f"{run}-{n}" for n in range(6)]
    start = threading.Barrier(4)

    def writer(seed: int) -> None:
        rng = random.Random(seed)
        with psycopg.connect(database.conninfo) as connection:
            start.wait(timeout=10)
            for number in range(60):
                chosen = rng.sample(aggregates, 2)
                with connection.transaction():
                    outbox.publish_many(
                        connection,
                        [
                            Event("order", aggregate, "Changed", {"writer": seed, "n": number})
                            for aggregate in chosen
                        ],
                    )
                    connection.execute("SELECT pg_sleep(random() * 0.002)")

    run_in_threads(writer, 4, timeout=90)
    total = 0
    for aggregate in aggregates:
        rows = rows_by_position(database, "outbox", aggregate)
        total += len(rows)
        commit_times = [row[2] for row in rows]
        assert commit_times == sorted(commit_times), f"aggregate {aggregate} out of order"
    assert total == 4 * 60 * 2
