"""Where the relay may start reading: the position below which no row can still appear.

Positions are drawn before commit, so a row with a lower position can become visible after
one with a higher position was read. The relay never skips such a row:

- it reads the undelivered rows that are *present* (delivered rows are deleted), lowest
  position first, so a late row is simply read by a later batch;
- it starts its index scan at a ``floor`` only to step over the deleted rows a long-open
  transaction keeps from being vacuumed; the floor only passes positions that are *final*.

A position is final when the transaction that drew it has ended. Every transaction gets its
xid before it draws a position (the trigger asks for it, migration ``outbox_0003``). So if
the sequence's last value ``L`` was read, and afterwards the relay was given a new xid ``X``,
every transaction that drew a position ``<= L`` has an xid ``< X``. Once a later snapshot's
``xmin >= X``, all of them ended: positions ``<= L`` are final, and a read under that
snapshot or a later one sees every committed row among them.

(``X`` must be a freshly assigned xid, ``pg_current_xact_id()``: a snapshot's ``xmax`` is
only "latest completed xid + 1", and a running transaction can hold an xid above it, which
is why the relay asks for an xid rather than a snapshot's ``xmax``: found the hard way.)

A row left in the table on purpose (its aggregate waits after a transient broker error,
relay/outbox_relay/parking.py) is *held*: the floor stays below it until it is released (published
or dead-lettered), or forgotten at a reset. Lowering the floor is always safe: the relay reads
present rows only, so a lower floor costs index steps, never a duplicate.

The invariant: **the floor never passes a present row that was not delivered.** A read's
candidate is applied later (once its batch is acknowledged) and, in polling mode, on the
database thread while the sending thread holds and releases rows; so a candidate must not
count on a hold still being there for a row the read did not see. Besides rows not committed
yet (never at or below ``final``), a read misses a present row only three ways, and each is
covered when the candidate is computed or applied:

- beyond its window: a full read's candidate stays at or below its last row;
- in flight (the batch being sent, left out of the read): that batch is answered before the
  candidate is applied, so such a row is delivered, or held (refused) by then;
- of an aggregate its query left out (it waits): the exclusion list comes with each
  aggregate's first waiting row, taken together under one lock, and the candidate stays
  below it (``excluded``). The aggregate's other rows are all above that row.

Rows a read did see and left in the table (their aggregate waits) are held before its
candidate can be applied, and released only once sent. So a stale hold set, a read built
before a release, can never move the floor past an aggregate's unread backlog (issue 22;
tests/unit/test_relay_interleavings.py drives the relay loop through drawn interleavings).

This module is pure: the relay feeds it what it read, it answers with numbers.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

__all__ = ["Horizon"]


@dataclass
class Horizon:
    """The relay's read floor: rows at or below ``floor`` are all delivered and final."""

    floor: int = 0
    _final: int = 0
    _marks: deque[tuple[int, int]] = field(default_factory=deque)
    _held: set[int] = field(default_factory=set)
    _held_lock: threading.Lock = field(default_factory=threading.Lock)
    """Holds change on the sending thread while the database thread advances the floor."""

    def observe(self, *, last_position: int, xid_bound: int, xmin: int) -> None:
        """Record what three statements, in this order, saw before a read.

        ``last_position``: the sequence's last drawn value; ``xid_bound``: an xid assigned
        after that; ``xmin``: the oldest running xid of a snapshot taken after that. Marks
        whose transactions all ended by ``xmin`` become final.
        """
        self._marks.append((last_position, xid_bound))
        while self._marks and self._marks[0][1] <= xmin:
            position, _ = self._marks.popleft()
            self._final = max(self._final, position)

    def settle(self, xmin: int) -> None:
        """Like :meth:`observe` without a new mark: the sequence did not move since the last
        one, so no new xid is needed (an idle relay consumes no transaction ids)."""
        while self._marks and self._marks[0][1] <= xmin:
            position, _ = self._marks.popleft()
            self._final = max(self._final, position)

    @property
    def observed(self) -> int:
        """The highest last position recorded (a mark, or final): a lower or equal one needs
        no new mark."""
        return self._marks[-1][0] if self._marks else self._final

    @property
    def final(self) -> int:
        """Every position up to here belongs to a transaction that has ended."""
        return self._final

    def candidate(
        self,
        positions: Sequence[int],
        *,
        limit: int,
        first_left: int | None = None,
        excluded: Iterable[int] = (),
    ) -> int:
        """Where the floor may go once the rows of this read are delivered (and deleted).

        Call it right after the read, ``positions`` being everything it returned (ascending,
        above the floor). ``limit`` is the read's row limit: a full read may have stopped
        before rows that are present beyond it. ``first_left`` is the lowest position read
        but left in the table (auto mode leaves fresh rows to CDC). ``excluded``: for each
        aggregate the read's query left out, the position of its first waiting row, taken
        together with the exclusion list (``Sender.waiting``): the read saw nothing of
        theirs. Nothing undelivered can then be present or appear at or below the answer,
        whatever holds are released before it is applied.
        """
        candidate = self._final
        if len(positions) >= limit and positions:
            candidate = min(candidate, positions[-1])
        if first_left is not None:
            candidate = min(candidate, first_left - 1)
        for first_waiting in excluded:
            candidate = min(candidate, first_waiting - 1)
        return candidate

    def advance(self, candidate: int) -> None:
        """The read that gave ``candidate`` (and every earlier one) was delivered."""
        with self._held_lock:
            if self._held:
                candidate = min(candidate, min(self._held) - 1)
            self.floor = max(self.floor, candidate)

    def hold(self, position: int) -> None:
        """The row at ``position`` stays in the table: keep the floor below it."""
        with self._held_lock:
            self._held.add(position)
            self.floor = min(self.floor, position - 1)

    def release(self, positions: Sequence[int]) -> None:
        """These rows left the table: they no longer hold the floor back."""
        with self._held_lock:
            self._held.difference_update(positions)

    @property
    def held(self) -> int:
        return len(self._held)

    def delivered(
        self,
        positions: Sequence[int],
        *,
        limit: int,
        first_left: int | None = None,
        excluded: Iterable[int] = (),
    ) -> None:
        """A read of ``positions`` was delivered at once: :meth:`candidate`, then advance."""
        self.advance(
            self.candidate(positions, limit=limit, first_left=first_left, excluded=excluded)
        )

    def reset(self) -> None:
        """Forget everything (after a reconnect or a change of leader): read from the start."""
        self.floor = 0
        self._final = 0
        self._marks.clear()
        with self._held_lock:
            self._held.clear()
