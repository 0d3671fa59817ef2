"""Aggregates that wait after a transient failure, with backoff per aggregate. (Pure.)

When a row's record was refused for a reason that can pass (relay/outbox_relay/failures.py), the row
stays in the outbox and its aggregate is *parked*: no row of that aggregate is sent until
the pause is over, so a newer event can never overtake the one that failed. Every other
aggregate goes on. The pause doubles with each failure of the same aggregate, from
``first_seconds`` up to ``max_seconds``, and is forgotten once a record of the aggregate is
acknowledged. Times are monotonic seconds (``time.monotonic()``).

The relay's reads leave out the rows of parked aggregates (:meth:`Parking.parked`), so a
long wait of one aggregate never fills the read window and stalls the others. With each
parked aggregate comes the position of its *first waiting row*, the lowest it had refused
since its last acknowledged record: every row of the aggregate still in the table is at or
above it (the aggregate is sent in position order, so the rows below it were acknowledged or
dead-lettered). A read that leaves the aggregate out reads nothing of it, so its floor stays
below that position (relay/outbox_relay/horizon.py). Exclusion list and positions are taken
together, under one lock: whatever the sending thread does afterwards, the positions are
those of the aggregates that read left out. Thread-safe: the sending thread parks, the
database thread reads.
"""

from __future__ import annotations

import threading
from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field

__all__ = ["Parking"]


@dataclass
class Parking:
    first_seconds: float
    max_seconds: float
    _until: dict[Hashable, float] = field(default_factory=dict)
    _pause: dict[Hashable, float] = field(default_factory=dict)
    _first_waiting: dict[Hashable, int] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def park(self, aggregate: Hashable, now: float, first_waiting: int) -> float:
        """The aggregate failed (again) at the row at ``first_waiting``, its lowest refused
        one: hold it back; returns the pause in seconds."""
        with self._lock:
            pause = min(self._pause.get(aggregate, self.first_seconds / 2) * 2, self.max_seconds)
            self._pause[aggregate] = pause
            self._until[aggregate] = now + pause
            earlier = self._first_waiting.get(aggregate, first_waiting)
            self._first_waiting[aggregate] = min(earlier, first_waiting)
        return pause

    def is_parked(self, aggregate: Hashable, now: float) -> bool:
        """True while the aggregate's pause runs (after it, one attempt is let through)."""
        until = self._until.get(aggregate)
        return until is not None and now < until

    def delivered(self, aggregate: Hashable) -> None:
        """A record of the aggregate was acknowledged: its next failure starts from scratch."""
        with self._lock:
            self._until.pop(aggregate, None)
            self._pause.pop(aggregate, None)
            self._first_waiting.pop(aggregate, None)

    def delivered_all(self, aggregates: Iterable[Hashable]) -> None:
        """:meth:`delivered` for each of ``aggregates``. While no aggregate has failed since
        its last acknowledgement (the usual case), nothing to do: ``aggregates`` is not even
        iterated. Called by the thread that parks (only it adds pauses)."""
        if not self._pause:
            return
        with self._lock:
            for aggregate in aggregates:
                self._until.pop(aggregate, None)
                self._pause.pop(aggregate, None)
                self._first_waiting.pop(aggregate, None)

    def count(self, now: float) -> int:
        """Aggregates whose pause is running."""
        return len(self.parked(now))

    def parked(self, now: float) -> dict[Hashable, int]:
        """The aggregates whose pause runs (leave their rows out of reads), each with the
        position of its first waiting row."""
        with self._lock:
            return {
                aggregate: self._first_waiting[aggregate]
                for aggregate, until in self._until.items()
                if now < until
            }

    def clear(self) -> None:
        with self._lock:
            self._until.clear()
            self._pause.clear()
            self._first_waiting.clear()
