"""The relay's read floor never passes a row that can still commit (a model of PostgreSQL)."""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from outbox_relay.horizon import Horizon


@dataclass
class Database:
    """Transactions get an xid, then draw positions; commit or roll back in any order."""

    next_xid: int = 100
    next_position: int = 1
    running: dict[int, list[int]] = field(default_factory=dict)
    committed: set[int] = field(default_factory=set)
    delivered: set[int] = field(default_factory=set)

    def begin(self) -> None:
        self.running[self.next_xid] = []
        self.next_xid += 1

    def draw(self, pick: int) -> None:
        if self.running:
            xid = sorted(self.running)[pick % len(self.running)]
            self.running[xid].append(self.next_position)
            self.next_position += 1

    def end(self, pick: int, commit: bool) -> None:
        if self.running:
            xid = sorted(self.running)[pick % len(self.running)]
            positions = self.running.pop(xid)
            if commit:
                self.committed.update(positions)

    def relay_step(self, horizon: Horizon, limit: int) -> None:
        last = self.next_position - 1  # read first, then a new xid, then a snapshot
        xid_bound = self.next_xid
        self.next_xid += 1  # the relay's own short transaction, ended at once
        xmin = min(self.running) if self.running else self.next_xid
        horizon.observe(last_position=last, xid_bound=xid_bound, xmin=xmin)
        present = sorted(p for p in self.committed - self.delivered if p > horizon.floor)
        read = present[:limit]
        self.delivered.update(read)
        horizon.delivered(read, limit=limit)


actions = st.lists(
    st.tuples(st.sampled_from(["begin", "draw", "commit", "rollback", "relay"]), st.integers(0, 9)),
    max_size=120,
)


@settings(max_examples=2000, deadline=None)
@given(actions=actions, limit=st.integers(1, 4))
def test_every_committed_row_is_read_whatever_the_commit_order(
    actions: list[tuple[str, int]], limit: int
) -> None:
    db = Database()
    horizon = Horizon()
    for action, pick in actions:
        if action == "begin":
            db.begin()
        elif action == "draw":
            db.draw(pick)
        elif action in ("commit", "rollback"):
            db.end(pick, commit=action == "commit")
        else:
            db.relay_step(horizon, limit)
        # The invariant: nothing committed and undelivered sits at or below the floor, and
        # nothing still running drew a position at or below it.
        assert all(p > horizon.floor for p in db.committed - db.delivered)
        assert all(p > horizon.floor for ps in db.running.values() for p in ps)
    while db.running:
        db.end(0, commit=True)
    for _ in range(len(db.committed) + 2):
        db.relay_step(horizon, limit)
    assert db.delivered == db.committed


def test_a_long_open_transaction_holds_the_floor_below_its_positions() -> None:
    db = Database()
    horizon = Horizon()
    db.begin()
    db.draw(0)  # position 1, open
    for _ in range(3):
        db.begin()
        db.draw(1)
        db.end(1, commit=True)
    db.relay_step(horizon, limit=10)
    assert db.delivered == {2, 3, 4}
    assert horizon.floor == 0  # position 1 may still commit
    db.end(0, commit=True)
    db.relay_step(horizon, limit=10)
    assert db.delivered == {1, 2, 3, 4}
    db.relay_step(horizon, limit=10)
    assert horizon.floor == 4
