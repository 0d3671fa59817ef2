"""The writers' ground truth: what each transaction's client knows of its events' fate.

Every event a writer builds ends in exactly one set:

- ``committed``: its transaction's COMMIT returned. It must reach the lake exactly once, at
  the position the transaction read back before committing (the position is commit order
  within its aggregate);
- ``unknown``: the COMMIT was sent and the client got an error instead of an answer (its
  connection was killed while committing, or PostgreSQL died): it may or may not be there,
  and if it is, at most once and in order. Counted apart;
- ``rolled_back``: the writer rolled back on purpose, after the events were written;
- ``aborted``: the transaction failed before its COMMIT was sent (a lost connection, a
  deadlock, PostgreSQL down): never committed.

Neither of the last two may appear on Kafka or in the lake. Thread-safe: every writer
records into one ledger. (Pure: stdlib only.)
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from pathlib import Path

__all__ = ["GroundTruth", "Outcome", "Written"]


class Outcome(StrEnum):
    COMMITTED = "committed"
    UNKNOWN = "unknown"
    ROLLED_BACK = "rolled_back"
    ABORTED = "aborted"


@dataclass(frozen=True, slots=True)
class Written:
    """One event as its writer knows it."""

    event_id: str
    aggregate_type: str
    aggregate_id: str
    position: int | None
    """Read back in the transaction before its end (None: the transaction failed first)."""
    version: int | None = None
    """The business row's version after the transaction's update (shared aggregates): it
    grows in commit order, whatever the order the events were built in."""


@dataclass
class GroundTruth:
    committed: dict[str, Written] = field(default_factory=dict)
    unknown: dict[str, Written] = field(default_factory=dict)
    rolled_back: dict[str, Written] = field(default_factory=dict)
    aborted: dict[str, Written] = field(default_factory=dict)
    transactions: Counter[str] = field(default_factory=Counter)
    """Transactions by outcome."""
    by_writer: Counter[str] = field(default_factory=Counter)
    """Committed events by writer (flavour and pattern)."""
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def record(self, writer: str, outcome: Outcome, events: list[Written]) -> None:
        target = {
            Outcome.COMMITTED: self.committed,
            Outcome.UNKNOWN: self.unknown,
            Outcome.ROLLED_BACK: self.rolled_back,
            Outcome.ABORTED: self.aborted,
        }[outcome]
        with self._lock:
            for event in events:
                target[event.event_id] = event
            self.transactions[outcome] += 1
            if outcome is Outcome.COMMITTED:
                self.by_writer[writer] += len(events)

    def never_committed(self) -> set[str]:
        """Ids that must appear nowhere: rolled back or aborted."""
        with self._lock:
            return set(self.rolled_back) | set(self.aborted)

    def known(self) -> set[str]:
        """Every id a writer built and tried to write."""
        with self._lock:
            return (
                set(self.committed) | set(self.unknown) | set(self.rolled_back) | set(self.aborted)
            )

    def committed_count(self) -> int:
        with self._lock:
            return len(self.committed)

    def save(self, path: Path) -> None:
        """One JSON line per event with its outcome: to look into a failing run."""
        with self._lock, path.open("w") as out:
            for outcome, events in (
                (Outcome.COMMITTED, self.committed),
                (Outcome.UNKNOWN, self.unknown),
                (Outcome.ROLLED_BACK, self.rolled_back),
                (Outcome.ABORTED, self.aborted),
            ):
                for event in events.values():
                    out.write(json.dumps({"outcome": outcome.value, **asdict(event)}) + "\n")
