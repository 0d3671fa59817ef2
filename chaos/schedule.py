"""The fault schedule: which fault, when, for how long; drawn from the run's seed.

Every kind is planned ``per_kind`` times, spread over the load phase with some jitter; about
one fault in three is then moved onto the start of the fault before it (when that one is on
another service), so that faults overlap: PostgreSQL killed while the broker is paused, the
network cut while Connect restarts, the broker killed with a relay. Faults on one service
never overlap each other (the injector takes the service's lock), so a planned overlap on one
service becomes a fault that waits its turn. (Pure: stdlib only; the same seed gives the
same schedule.)
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from enum import StrEnum

__all__ = ["HOLD_SECONDS", "RESOURCE", "Kind", "PlannedFault", "plan_faults"]


class Kind(StrEnum):
    CONNECT_KILL = "kill -9 Connect"
    RELAY_KILL = "kill -9 leading relay"
    LAKE_KILL = "kill -9 Spark driver"
    POSTGRES_KILL = "kill -9 postmaster"
    BROKER_KILL = "kill -9 broker"
    BROKER_PAUSE = "broker paused"
    NETWORK_CUT = "relay/PostgreSQL network cut"
    CONNECTOR_RECREATE = "connector deleted, re-applied"
    CHECKPOINT_DELETE = "lake checkpoint deleted"


RESOURCE = {
    Kind.CONNECT_KILL: "connect",
    Kind.CONNECTOR_RECREATE: "connect",
    Kind.RELAY_KILL: "relay",
    Kind.NETWORK_CUT: "relay",
    Kind.LAKE_KILL: "lake",
    Kind.CHECKPOINT_DELETE: "lake",
    Kind.POSTGRES_KILL: "postgres",
    Kind.BROKER_KILL: "broker",
    Kind.BROKER_PAUSE: "broker",
}
"""The service each fault acts on (the lock the injector takes)."""

HOLD_SECONDS = {
    Kind.CONNECT_KILL: (1.0, 8.0),  # down before the supervisor starts it again
    Kind.RELAY_KILL: (0.5, 5.0),
    Kind.LAKE_KILL: (1.0, 8.0),
    Kind.POSTGRES_KILL: (0.0, 2.0),  # a fast restart
    Kind.BROKER_KILL: (1.0, 8.0),  # down before the supervisor starts it again
    Kind.BROKER_PAUSE: (5.0, 20.0),  # SIGSTOP to SIGCONT
    Kind.NETWORK_CUT: (12.0, 20.0),  # longer than the relay's lease (10 s): the standby leads
    Kind.CONNECTOR_RECREATE: (3.0, 15.0),  # deleted to re-applied
    Kind.CHECKPOINT_DELETE: (2.0, 10.0),  # deleted to the job's restart
}

_OVERLAP_FRACTION = 1 / 3


@dataclass(frozen=True)
class PlannedFault:
    at: float
    """Seconds after the load started."""
    kind: Kind
    hold: float
    """Seconds the fault lasts before the service is brought back."""
    occurrence: int
    """1 for the first fault of its kind, 2 for the second..."""


def plan_faults(
    seed: int, *, load_seconds: float, per_kind: int, kinds: tuple[Kind, ...] = tuple(Kind)
) -> list[PlannedFault]:
    """The schedule, sorted by time: faults between 8% and 80% of the load phase, so the
    last ones are brought back while the writers still write."""
    rng = random.Random(f"faults:{seed}")  # noqa: S311 - a replayable schedule, no secret
    order = [kind for kind in kinds for _ in range(per_kind)]
    rng.shuffle(order)
    start, end = max(5.0, 0.08 * load_seconds), 0.8 * load_seconds
    spacing = (end - start) / len(order)
    times = [start + slot * spacing + rng.uniform(0, 0.6 * spacing) for slot in range(len(order))]
    for slot in range(1, len(order)):
        if rng.random() < _OVERLAP_FRACTION and RESOURCE[order[slot]] != RESOURCE[order[slot - 1]]:
            times[slot] = times[slot - 1] + rng.uniform(0.0, 3.0)
    seen: dict[Kind, int] = {}
    planned = []
    for at, kind in zip(times, order, strict=True):
        seen[kind] = seen.get(kind, 0) + 1
        low, high = HOLD_SECONDS[kind]
        planned.append(
            PlannedFault(round(at, 1), kind, round(rng.uniform(low, high), 1), seen[kind])
        )
    return sorted(planned, key=lambda fault: fault.at)
