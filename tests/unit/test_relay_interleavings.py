"""The polling relay's two threads, interleaved in every way a drawn schedule says.

The real ``Relay._relay_polling``, ``Sender``, ``Parking`` and ``Horizon`` run against a
model of the outbox table (rows written at any moment, all committed at once) and a
producer that refuses the aggregates a schedule names, for a reason that can pass. A
deterministic scheduler lets one thread run at a time and may switch to the other at each
call into the fakes (entry and exit of every database statement, the producer's answer, the
loop's idle wait); at each of those points the schedule may also move the sender's clock
(pauses end) or write a row. Hypothesis draws and shrinks the schedule, so a race is found
and replayed without sleeps or timing luck.

Checked at every point: the read floor never passes a present row that was not delivered;
per aggregate, records are acknowledged in position order, each once; and at the end,
with the broker taking everything again, every row leaves the table.
"""

from __future__ import annotations

import threading
import uuid
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

from outbox import OutboxSettings
from outbox_relay.database import Backlog, OutboxRow
from outbox_relay.producer import BatchOutcome, Retry
from outbox_relay.service import Relay
from outbox_relay.settings import RelaySettings

pytestmark = pytest.mark.timeout(240)

Aggregate = tuple[str, bytes]
AGGREGATES: list[Aggregate] = [("order", b"a"), ("order", b"b"), ("invoice", b"a")]
GATE_SECONDS = 10.0
"""How long a thread waits for its turn: only reached when the scheduler is stuck."""
DRAIN_ROUNDS = 30
"""Loop rounds allowed after the schedule, the broker taking everything, without a row leaving
the table (a batch of one row drains a long table one row a round: the bound is on progress)."""

Point = tuple[bool, float, Aggregate | None]
"""At a switch point: switch to the other thread?, seconds the clock moves, a row to write."""

points = st.lists(
    st.tuples(
        st.booleans(),
        st.sampled_from([*[0.0] * 8, 0.6, 5.0]),  # a pause ends now and then, not always
        st.sampled_from([*[None] * 9, *AGGREGATES]),
    ),
    min_size=30,  # hypothesis draws short lists by default: the run would end at once
    max_size=100,
)
refusals = st.lists(st.frozensets(st.sampled_from(AGGREGATES), max_size=2), min_size=1, max_size=8)


class SchedulerStuck(Exception):
    """A thread waited for its turn longer than GATE_SECONDS (a bug in the test)."""


@dataclass
class Model:
    """The outbox table, the broker's acknowledgements and the sender's clock."""

    rows: dict[int, OutboxRow] = field(default_factory=dict)
    """Present rows by position."""
    acknowledged: set[int] = field(default_factory=set)
    sent: dict[Aggregate, list[int]] = field(default_factory=dict)
    last_position: int = 0
    now: float = 0.0
    violations: list[str] = field(default_factory=list)

    def write(self, aggregate: Aggregate) -> None:
        self.last_position += 1
        aggregate_type, key = aggregate
        self.rows[self.last_position] = OutboxRow(
            str(uuid.uuid4()), aggregate_type, key, b"T", b"{}", b"{}", b"", self.last_position
        )

    def undelivered(self) -> list[int]:
        return sorted(p for p in self.rows if p not in self.acknowledged)

    def check_floor(self, floor: int) -> None:
        passed = [p for p in self.undelivered() if p <= floor]
        if passed:
            self.violations.append(f"floor {floor} passed undelivered rows {passed}")

    def acknowledge(self, row: OutboxRow) -> None:
        aggregate = (row.aggregate_type, row.key)
        older = [
            p
            for p in self.undelivered()
            if p < row.position and (self.rows[p].aggregate_type, self.rows[p].key) == aggregate
        ]
        if older or row.position in self.acknowledged:
            self.violations.append(
                f"{aggregate} row {row.position} acknowledged while older rows {older} wait "
                f"(acknowledged before: {self.sent.get(aggregate, [])})"
            )
        self.acknowledged.add(row.position)
        self.sent.setdefault(aggregate, []).append(row.position)


class Scheduler:
    """One thread runs at a time; at each switch point the next drawn point decides."""

    def __init__(self, model: Model, schedule: Sequence[Point], floor: Callable[[], int]) -> None:
        self.model = model
        self._points = deque(schedule)
        self._floor = floor
        self._condition = threading.Condition()
        self._turn = "main"
        self._database_running = False
        self._main_waits = False
        self.main_ident: int | None = None
        self.drain_rounds = 0
        self._rows_left = len(model.rows)

    @property
    def draining(self) -> bool:
        """The schedule is spent: nothing is refused any more and time flies."""
        return not self._points

    def finished(self) -> bool:
        model = self.model
        if model.violations or (self.draining and not model.rows):
            return True
        if self.draining:
            self.drain_rounds += 1
            if len(model.rows) < self._rows_left:  # progress: the bound starts again
                self.drain_rounds = 0
        self._rows_left = len(model.rows)
        return self.drain_rounds > DRAIN_ROUNDS

    def _wait_for(self, ready: Callable[[], bool]) -> None:
        if not self._condition.wait_for(ready, timeout=GATE_SECONDS):
            raise SchedulerStuck(f"turn {self._turn}, database running {self._database_running}")

    def point(self) -> None:
        """A switch point of the calling thread."""
        who = "main" if threading.get_ident() == self.main_ident else "database"
        with self._condition:
            switch, seconds, write = self._points.popleft() if self._points else (False, 0, None)
            self.model.now += seconds
            if write is not None:
                self.model.write(write)
            self.model.check_floor(self._floor())
            other_runs = self._database_running if who == "main" else not self._main_waits
            if switch and other_runs:
                self._turn = "database" if who == "main" else "main"
                self._condition.notify_all()
                self._wait_for(lambda: self._turn == who)

    def submitted(self) -> None:
        with self._condition:
            self._database_running = True

    def database_starts(self) -> None:
        with self._condition:
            self._wait_for(lambda: self._turn == "database")

    def database_ends(self) -> None:
        with self._condition:
            self._database_running = False
            self._turn = "main"
            self._condition.notify_all()

    def main_waits_for_database(self) -> None:
        with self._condition:
            if not self._database_running:
                return
            self._main_waits = True
            self._turn = "database"
            self._condition.notify_all()
            try:
                self._wait_for(lambda: not self._database_running)
            finally:
                self._main_waits = False


class ScheduledFuture:
    def __init__(self, scheduler: Scheduler, future: Future[Any]) -> None:
        self._scheduler = scheduler
        self._future = future

    def result(self) -> Any:
        self._scheduler.main_waits_for_database()
        return self._future.result(timeout=GATE_SECONDS)


def executor_for(scheduler: Scheduler) -> type:
    class ScheduledExecutor:
        """The relay's database thread, run only when the scheduler gives it the turn."""

        def __init__(self, max_workers: int, thread_name_prefix: str) -> None:
            self._pool = ThreadPoolExecutor(max_workers, thread_name_prefix)

        def __enter__(self) -> ScheduledExecutor:
            return self

        def __exit__(self, *_: object) -> None:
            self._pool.shutdown(wait=True)

        def submit(self, work: Callable[..., Any], *args: Any) -> ScheduledFuture:
            scheduler.submitted()

            def scheduled() -> Any:
                try:
                    scheduler.database_starts()
                    return work(*args)
                finally:
                    scheduler.database_ends()

            return ScheduledFuture(scheduler, self._pool.submit(scheduled))

    return ScheduledExecutor


class ModelDatabase:
    """``RelayDatabase`` over the model. Reads and deletes are switch points before and after
    (the other thread may release, hold or park between the exclusion list and the query,
    and between a delete and the floor it allows); the horizon's statements touch nothing
    the other thread changes, so one point before them is enough."""

    rebalance_wanted = False
    free_slices = 0
    """Every slice stays with the one relay (relays sharing slices: test_relay_slices.py)."""

    def __init__(self, scheduler: Scheduler) -> None:
        self._scheduler = scheduler
        self._model = scheduler.model
        self._xid = 1000

    def _around(self, statement: Callable[[], Any]) -> Any:
        self._scheduler.point()
        answer = statement()
        self._scheduler.point()
        return answer

    def renew_if_due(self) -> None:
        pass

    def renew_while(self, sending: threading.Event) -> None:
        """No leases here: the cycle ends as soon as its read does (a fast send's case)."""

    def check_lease(self) -> None:
        pass

    def close(self) -> None:
        pass

    def backlog(self) -> Backlog:
        return Backlog(len(self._model.rows), 0.0, 0, {})

    def last_position(self) -> int:
        self._scheduler.point()  # a row may be written between this and the read
        return self._model.last_position

    def new_xid(self) -> int:
        self._xid += 1
        return self._xid

    def oldest_running_xid(self) -> int:
        return self._xid + 1  # every writer ended at once

    def read(
        self,
        floor: int,
        limit: int,
        excluding: Sequence[Aggregate] = (),
        in_flight: Sequence[int] = (),
    ) -> list[OutboxRow]:
        left_out = set(excluding)
        skipped = set(in_flight)

        def select() -> list[OutboxRow]:
            rows = self._model.rows
            return [
                rows[p]
                for p in sorted(rows)
                if p > floor
                and p not in skipped
                and (rows[p].aggregate_type, rows[p].key) not in left_out
            ][:limit]

        rows: list[OutboxRow] = self._around(select)
        return rows

    def finish(
        self,
        delivered: Sequence[str],
        rejected: Sequence[tuple[str, str]],
        between: tuple[int, int],
    ) -> None:
        gone = {*delivered, *(event_id for event_id, _ in rejected)}
        lowest, highest = between

        def delete() -> None:
            rows = self._model.rows
            for position in [p for p, row in rows.items() if row.id in gone]:
                if not lowest <= position <= highest:  # the statement would leave it
                    self._model.violations.append(f"row {position} outside {between}")
                del rows[position]

        self._around(delete)


def producer_for(scheduler: Scheduler, refused: Sequence[frozenset[Aggregate]]) -> type:
    answers = deque(refused)

    class ModelProducer:
        """Acknowledges a batch, but for the aggregates the next drawn answer refuses."""

        def __init__(self, bootstrap_servers: str, settings: RelaySettings) -> None:
            pass

        def publish(self, rows: Sequence[OutboxRow]) -> BatchOutcome:
            scheduler.point()
            refuse = answers.popleft() if answers and not scheduler.draining else frozenset()
            outcome = BatchOutcome()
            for row in rows:
                if (row.aggregate_type, row.key) in refuse:
                    outcome.retry.append(Retry(row, "not authorized (for now)", "Refused"))
                else:
                    scheduler.model.acknowledge(row)
                    outcome.delivered.append(row.id)
            scheduler.point()
            return outcome

        def close(self) -> None:
            pass

    return ModelProducer


class ScheduledStop:
    """The relay's stop event: set once the run is over; its idle wait is a switch point."""

    def __init__(self, scheduler: Scheduler) -> None:
        self._scheduler = scheduler

    def is_set(self) -> bool:
        return self._scheduler.finished()

    def wait(self, timeout: float) -> bool:
        if self._scheduler.draining:
            self._scheduler.model.now += 10.0  # every pause ends
        self._scheduler.point()
        return self.is_set()


@dataclass
class Run:
    model: Model
    floor: int
    errors: list[BaseException]
    stopped: bool


def run_relay(
    initial: Sequence[Aggregate],
    batch_size: int,
    schedule: Sequence[Point],
    refused: Sequence[frozenset[Aggregate]],
) -> Run:
    """The relay's polling loop over a table of ``initial`` rows, interleaved by ``schedule``."""
    model = Model()
    for aggregate in initial:
        model.write(aggregate)
    relays: list[Relay] = []
    scheduler = Scheduler(model, schedule, floor=lambda: relays[0]._horizon.floor)
    database = ModelDatabase(scheduler)
    errors: list[BaseException] = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("outbox_relay.service.RelayDatabase", lambda *_, **__: database)
        patch.setattr("outbox_relay.service.ThreadPoolExecutor", executor_for(scheduler))
        patch.setattr("outbox_relay.sender.ContractProducer", producer_for(scheduler, refused))
        patch.setattr("outbox_relay.sender.time", SimpleNamespace(monotonic=lambda: model.now))
        relay = Relay(
            RelaySettings(
                batch_size=batch_size,
                idle_seconds=0.01,
                retry_backoff_seconds=1.0,
                max_backoff_seconds=4.0,
                http_port=0,
            ),
            database_url="postgresql://unused",
            kafka="unused:9092",
            tables=OutboxSettings().tables,
        )
        relays.append(relay)

        def run() -> None:
            scheduler.main_ident = threading.get_ident()
            try:
                relay._relay_polling(ScheduledStop(scheduler))  # type: ignore[arg-type]
            except BaseException as error:
                errors.append(error)

        thread = threading.Thread(target=run, name="relay-polling-under-test")
        thread.start()
        thread.join(timeout=GATE_SECONDS * 6)
    return Run(model, relay._horizon.floor, errors, stopped=not thread.is_alive())


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    initial=st.lists(st.sampled_from(AGGREGATES), max_size=12),
    batch_size=st.integers(1, 3),
    schedule=points,
    refused=refusals,
)
def test_no_interleaving_lets_the_floor_pass_a_row_or_an_aggregate_go_out_of_order(
    initial: list[Aggregate],
    batch_size: int,
    schedule: list[Point],
    refused: list[frozenset[Aggregate]],
) -> None:
    run = run_relay(initial, batch_size, schedule, refused)
    assert run.stopped, "the relay loop did not stop"
    note(f"acknowledged per aggregate: {run.model.sent}")
    assert not run.errors, run.errors
    assert not run.model.violations, run.model.violations[0]
    assert not run.model.rows, (
        f"rows {sorted(run.model.rows)} never left the table (floor {run.floor})"
    )
