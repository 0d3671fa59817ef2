"""The polling relay's pipeline under forced interleavings of its two threads.

The real ``Relay._relay_polling``, ``Sender``, ``Parking`` and ``Horizon``; fakes only for
the I/O: a table in memory instead of PostgreSQL, a scripted producer instead of Kafka, and
a clock for the sender's pauses. The fakes hold one thread back until the other has done a
given step, so each test forces the same interleaving on every run (no sleeps, no timing
luck). tests/unit/test_relay_interleavings.py explores the interleavings at large.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest

from outbox import OutboxSettings
from outbox_relay.database import Backlog, OutboxRow
from outbox_relay.horizon import Horizon
from outbox_relay.producer import BatchOutcome, Retry
from outbox_relay.service import Relay
from outbox_relay.settings import RelaySettings

pytestmark = pytest.mark.timeout(60)

Aggregate = tuple[str, bytes]
WAITING: Aggregate = ("order", b"a")
"""The aggregate whose first batch the broker refuses: it waits while the others go on."""
OTHER: Aggregate = ("order", b"b")
GATE_SECONDS = 10.0
"""How long a fake holds its thread back for the other one (only reached on a hang)."""


def row(aggregate: Aggregate, position: int) -> OutboxRow:
    aggregate_type, key = aggregate
    return OutboxRow(str(uuid.uuid4()), aggregate_type, key, b"Tick", b"{}", b"{}", b"", position)


def aggregate_of(outbox_row: OutboxRow) -> Aggregate:
    return (outbox_row.aggregate_type, outbox_row.key)


@dataclass
class Clock:
    """The sender's ``time`` module: it moves only when a test moves it."""

    now: float = 0.0

    def monotonic(self) -> float:
        return self.now


@dataclass
class Scenario:
    """What the fakes share: the table, what the broker took, the steps that gate each other."""

    table: dict[str, OutboxRow]
    clock: Clock = field(default_factory=Clock)
    on_read: Callable[[Sequence[Aggregate]], None] = lambda excluding: None
    """Called after each read with the aggregates it left out."""
    before_finish: Callable[[Sequence[str]], None] = lambda delivered: None
    """Called on the database thread before it deletes what the broker took."""
    on_hold: Callable[[int], None] = lambda position: None
    """Called on the sending thread when a row is held (left in the table on purpose)."""
    reads: int = 0
    sent: list[OutboxRow] = field(default_factory=list)
    refused_once: bool = False
    second_read_done: threading.Event = field(default_factory=threading.Event)
    waiting_released: threading.Event = field(default_factory=threading.Event)
    nothing_to_read: threading.Event = field(default_factory=threading.Event)
    errors: list[BaseException] = field(default_factory=list)

    def left(self) -> list[int]:
        return sorted(r.position for r in self.table.values())

    def sent_by_aggregate(self) -> dict[Aggregate, list[int]]:
        sent: dict[Aggregate, list[int]] = {}
        for r in self.sent:
            sent.setdefault(aggregate_of(r), []).append(r.position)
        return sent


class TableDatabase:
    """``RelayDatabase`` over an in-memory table whose rows all committed (all final)."""

    rebalance_wanted = False
    free_slices = 0

    def __init__(self, scenario: Scenario) -> None:
        self.scenario = scenario
        self._xid = 1000
        self._lock = threading.Lock()

    def renew_if_due(self) -> None:
        pass

    def renew_while(self, sending: threading.Event) -> None:
        """No leases here: the cycle ends as soon as its read does (a fast send's case)."""

    def check_lease(self) -> None:
        pass

    def close(self) -> None:
        pass

    def last_position(self) -> int:
        return max((r.position for r in self.scenario.table.values()), default=0)

    def new_xid(self) -> int:
        self._xid += 1
        return self._xid

    def oldest_running_xid(self) -> int:
        return self._xid + 1  # no writer runs: every drawn position is final

    def backlog(self) -> Backlog:
        return Backlog(len(self.scenario.table), 0.0, 0, {})

    def read(
        self,
        floor: int,
        limit: int,
        excluding: Sequence[Aggregate] = (),
        in_flight: Sequence[int] = (),
    ) -> list[OutboxRow]:
        scenario = self.scenario
        left_out = set(excluding)
        skipped = set(in_flight)
        with self._lock:
            rows = sorted(
                (
                    r
                    for r in scenario.table.values()
                    if r.position > floor
                    and aggregate_of(r) not in left_out
                    and r.position not in skipped
                ),
                key=lambda r: r.position,
            )[:limit]
            scenario.reads += 1
        if scenario.reads == 2:
            scenario.second_read_done.set()
        if not rows:
            scenario.nothing_to_read.set()  # the table is empty, or the floor is above it
        scenario.on_read(excluding)
        return rows

    def finish(
        self,
        delivered: Sequence[str],
        rejected: Sequence[tuple[str, str]],
        between: tuple[int, int],
    ) -> None:
        self.scenario.before_finish(delivered)
        with self._lock:
            for event_id in [*delivered, *(event_id for event_id, _ in rejected)]:
                self.scenario.table.pop(event_id, None)


def producer_for(scenario: Scenario) -> type:
    class ScriptedProducer:
        """Refuses the waiting aggregate's first batch for a reason that can pass, while the
        database thread reads the next batch; takes everything else."""

        def __init__(self, bootstrap_servers: str, settings: RelaySettings) -> None:
            pass

        def publish(self, rows: Sequence[OutboxRow]) -> BatchOutcome:
            refused = [r for r in rows if aggregate_of(r) == WAITING]
            if refused and not scenario.refused_once:
                scenario.refused_once = True
                assert scenario.second_read_done.wait(GATE_SECONDS), "no second read"
                return BatchOutcome(
                    delivered=[r.id for r in rows if r not in refused],
                    retry=[Retry(r, "not authorized (for now)", "Refused") for r in refused],
                )
            scenario.sent.extend(rows)
            return BatchOutcome(delivered=[r.id for r in rows])

        def close(self) -> None:
            pass

    return ScriptedProducer


def observed_horizon(scenario: Scenario) -> type[Horizon]:
    class ObservedHorizon(Horizon):
        """The real horizon; it tells the fakes when a row is held, and when the waiting
        aggregate was released."""

        def hold(self, position: int) -> None:
            super().hold(position)
            scenario.on_hold(position)

        def release(self, positions: Sequence[int]) -> None:
            super().release(positions)
            waiting = {r.position for r in scenario.table.values() if aggregate_of(r) == WAITING}
            if waiting & set(positions):
                scenario.waiting_released.set()

    return ObservedHorizon


def relay_until_nothing_to_read(
    scenario: Scenario, monkeypatch: pytest.MonkeyPatch, *, batch_size: int
) -> Relay:
    """Run the real polling loop on the fakes until a read finds nothing, then stop it."""
    database = TableDatabase(scenario)
    monkeypatch.setattr("outbox_relay.service.RelayDatabase", lambda *_, **__: database)
    monkeypatch.setattr("outbox_relay.service.Horizon", observed_horizon(scenario))
    monkeypatch.setattr("outbox_relay.sender.ContractProducer", producer_for(scenario))
    monkeypatch.setattr(
        "outbox_relay.sender.time", SimpleNamespace(monotonic=scenario.clock.monotonic)
    )
    settings = RelaySettings(
        batch_size=batch_size, idle_seconds=0.01, retry_backoff_seconds=1.0, http_port=0
    )
    relay = Relay(
        settings,
        database_url="postgresql://unused",
        kafka="unused:9092",
        tables=OutboxSettings().tables,
    )
    stop = threading.Event()

    def run() -> None:
        try:
            relay._relay_polling(stop)
        except BaseException as error:
            scenario.errors.append(error)
            raise

    thread = threading.Thread(target=run, name="relay-polling-under-test")
    thread.start()
    try:
        assert scenario.nothing_to_read.wait(GATE_SECONDS), "the relay never ran out of rows"
    finally:
        stop.set()
        thread.join(timeout=GATE_SECONDS * 3)
    assert not thread.is_alive(), "the relay loop did not stop"
    assert not scenario.errors, scenario.errors
    assert scenario.refused_once, "the broker never refused: the race was not forced"
    return relay


def test_a_read_that_left_out_a_waiting_aggregate_never_floors_past_its_backlog(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 22, item 3. The waiting aggregate has more rows (1..6) than a read takes; while
    it waits, a read leaves it out and reads 7, 8 of another aggregate. Its pause ends, its
    first rows (1..4) are sent and released, and only then does the database thread apply the
    floor of that earlier read. That floor must not pass 5 and 6: they are sent before 13."""
    rows = [
        *(row(WAITING, p) for p in range(1, 7)),
        *(row(OTHER, p) for p in range(7, 13)),
        *(row(WAITING, p) for p in (13, 14)),
    ]
    scenario = Scenario({r.id: r for r in rows})
    first_other = rows[6].id
    finish_waited: list[bool] = []

    def pause_ends_once_left_out(excluding: Sequence[Aggregate]) -> None:
        if WAITING in excluding:
            scenario.clock.now = 100.0  # the read that left it out is built: its pause ends

    def floor_applied_after_release(delivered: Sequence[str]) -> None:
        if first_other in delivered:  # the batch read while the waiting aggregate was left out
            finish_waited.append(scenario.waiting_released.wait(GATE_SECONDS))

    scenario.on_read = pause_ends_once_left_out
    scenario.before_finish = floor_applied_after_release
    relay = relay_until_nothing_to_read(scenario, monkeypatch, batch_size=2)
    assert finish_waited == [True], "the race was not forced"
    sent = scenario.sent_by_aggregate()
    assert scenario.left() == [], (
        f"rows {scenario.left()} left below the floor {relay._horizon.floor}, never read "
        f"again, while newer rows of their aggregate went out: {sent[WAITING]}"
    )
    assert sent == {WAITING: [1, 2, 3, 4, 5, 6, 13, 14], OTHER: list(range(7, 13))}


def test_rows_read_while_their_aggregate_was_refused_wait_even_when_the_pause_ended(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The database thread reads 2 (skipping 1, in flight) while the broker refuses 1; that
    database cycle takes longer than the pause, so the pause is over when 2 would be sent. It
    must still wait: 1 goes first."""
    rows = [row(WAITING, p) for p in (1, 2, 3)]
    scenario = Scenario({r.id: r for r in rows})

    def cycle_outlasts_the_pause(position: int) -> None:
        if position == 1:  # the refused row is held, its pause set from the time before this
            scenario.clock.now = 100.0

    scenario.on_hold = cycle_outlasts_the_pause
    relay_until_nothing_to_read(scenario, monkeypatch, batch_size=1)
    assert scenario.sent_by_aggregate() == {WAITING: [1, 2, 3]}, "a newer row overtook"
    assert scenario.left() == []
