"""The relay process's garbage collector: the youngest generation large enough that a batch
dies young.

The polling relay keeps about three batches of rows alive at any time (one read, one being
sent, one acknowledged and being deleted), and the producer a future for each record: tens of
thousands of objects that live a few hundred milliseconds. With CPython's default thresholds
(700, 10, 10) nearly all of them outlive two young collections and reach the oldest
generation, whose growth then triggers full collections: each walks every object of the
process while every thread waits. Measured (benchmarks/notes.md): 12 to 15 full collections
per 100,000 events, 1.3 to 1.6 s of a drain of 6 to 9 s. Collecting the youngest generation
every 100,000 allocations instead, a batch is gone before it would be promoted: at most one
full collection per 100,000 events. Only cyclic garbage waits longer to be freed (everything
else goes when its last reference does), a few MiB at most.

The thresholds are the process's (the collector is global): ``outbox relay run`` sets them
for its process, which does nothing else; the relay's benchmark sets them once for the
process that measures both the relay and the bare producer it is compared with.
"""

from __future__ import annotations

import gc

__all__ = ["YOUNG_GENERATION_OBJECTS", "collect_young_rarely"]

YOUNG_GENERATION_OBJECTS = 100_000
"""Allocations (less deallocations) of tracked objects between two young collections."""


def collect_young_rarely() -> None:
    """Collect the youngest generation every :data:`YOUNG_GENERATION_OBJECTS` allocations, or
    less often if it already is; the older generations' thresholds stay as they are."""
    young, middle, old = gc.get_threshold()
    gc.set_threshold(max(young, YOUNG_GENERATION_OBJECTS), middle, old)
