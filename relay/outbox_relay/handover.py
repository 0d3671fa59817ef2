"""Auto mode's decision: does the relay publish, or leave the rows to CDC? (Pure.)

CDC is primary. The relay watches what CDC delivers (and deletes those rows), and keeps, for
each row it reads, the moment it first saw it. While CDC keeps up, every row it reads is
fresh and it stands by. When a row stays undelivered longer than the grace period, CDC is
not delivering (Connect down, task failed, slot gone): the relay *takes over* and publishes
everything it reads, lowest position first, like the polling mode. It *steps back* once it
has drained the backlog and has seen a CDC heartbeat produced after it took over, proof
that the WAL flows to Kafka again.

Duplicates happen only around a switch (CDC replays what the relay already sent, or the
reverse) and carry the original event id. Nothing is lost: a row leaves the table only when
some path's record of it is on Kafka.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

__all__ = ["Handover"]


@dataclass
class Handover:
    grace_seconds: float
    took_over_at: float | None = None
    """When the relay took over (wall clock, as CDC's heartbeat timestamps); None while it
    stands by. The grace period itself is measured on the monotonic clock: a wall clock
    stepped forward (NTP) must not make the relay take over, nor one stepped back delay it."""
    takeovers: int = 0
    stepbacks: int = 0
    _last_cdc_heartbeat: float | None = None
    _first_seen: dict[Hashable, float] = field(default_factory=dict)

    @property
    def publishing(self) -> bool:
        return self.took_over_at is not None

    def should_publish(
        self, event_ids: Sequence[Hashable], now: float, *, wall_now: float | None = None
    ) -> bool:
        """Given the ids of one read (in position order), publish them all, or none?

        ``now``: monotonic seconds (``time.monotonic()``); ``wall_now``: the wall clock
        (``time.time()``), recorded as the takeover time (default: ``now``).
        """
        self._first_seen = {event_id: self._first_seen.get(event_id, now) for event_id in event_ids}
        if self.publishing:
            return bool(event_ids)
        if any(now - seen >= self.grace_seconds for seen in self._first_seen.values()):
            self.took_over_at = now if wall_now is None else wall_now
            self.takeovers += 1
            return True
        return False

    def cdc_heartbeat(self, produced_at: float) -> None:
        """A CDC heartbeat record produced at this (wall clock) time reached Kafka."""
        if self._last_cdc_heartbeat is None or produced_at > self._last_cdc_heartbeat:
            self._last_cdc_heartbeat = produced_at

    def drained(self) -> bool:
        """The relay read less than a full batch and published it. Step back? (True: it did.)"""
        if (
            self.took_over_at is not None
            and self._last_cdc_heartbeat is not None
            and self._last_cdc_heartbeat > self.took_over_at
        ):
            self.took_over_at = None
            self._first_seen.clear()
            self.stepbacks += 1
            return True
        return False
