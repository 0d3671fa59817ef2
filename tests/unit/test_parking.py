"""Aggregates that wait after a transient refusal, and the floor held below their rows."""

from __future__ import annotations

from outbox_relay.horizon import Horizon
from outbox_relay.parking import Parking


def test_an_aggregate_waits_with_doubling_pauses_until_delivered() -> None:
    parking = Parking(first_seconds=1.0, max_seconds=3.0)
    assert not parking.is_parked("a", 0.0)
    assert parking.park("a", 0.0) == 1.0
    assert parking.is_parked("a", 0.5) and not parking.is_parked("b", 0.5)
    assert not parking.is_parked("a", 1.0)
    assert parking.park("a", 1.0) == 2.0
    assert parking.park("a", 3.0) == 3.0  # capped
    assert parking.count(3.5) == 1
    parking.delivered("a")
    assert not parking.is_parked("a", 3.5)
    assert parking.park("a", 4.0) == 1.0  # starts from scratch


def test_the_floor_stays_below_a_held_row_until_it_is_released() -> None:
    horizon = Horizon()
    horizon.observe(last_position=100, xid_bound=10, xmin=11)
    horizon.advance(50)
    horizon.hold(20)
    assert horizon.floor == 19  # lowered at once: the row is read again
    horizon.advance(horizon.candidate([60, 70], limit=10))
    assert horizon.floor == 19
    horizon.release([20])
    horizon.advance(horizon.candidate([], limit=10))
    assert horizon.floor == 100
    horizon.hold(150)
    horizon.reset()
    assert horizon.held == 0
