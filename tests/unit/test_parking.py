"""Aggregates that wait after a transient refusal, and the floor held below their rows."""

from __future__ import annotations

from collections.abc import Iterator

from outbox_relay.horizon import Horizon
from outbox_relay.parking import Parking


def test_an_aggregate_waits_with_doubling_pauses_until_delivered() -> None:
    parking = Parking(first_seconds=1.0, max_seconds=3.0)
    assert not parking.is_parked("a", 0.0)
    assert parking.park("a", 0.0, 10) == 1.0
    assert parking.is_parked("a", 0.5) and not parking.is_parked("b", 0.5)
    assert not parking.is_parked("a", 1.0)
    assert parking.park("a", 1.0, 10) == 2.0
    assert parking.park("a", 3.0, 10) == 3.0  # capped
    assert parking.count(3.5) == 1
    parking.delivered("a")
    assert not parking.is_parked("a", 3.5)
    assert parking.park("a", 4.0, 12) == 1.0  # starts from scratch


def test_a_parked_aggregate_comes_with_its_lowest_refused_position_until_delivered() -> None:
    parking = Parking(first_seconds=1.0, max_seconds=8.0)
    parking.park("a", 0.0, 12)
    parking.park("a", 0.0, 10)
    parking.park("b", 0.0, 30)
    assert parking.parked(0.5) == {"a": 10, "b": 30}
    parking.park("a", 5.0, 14)  # refused again later: rows from 10 may still be in the table
    assert parking.parked(5.5) == {"a": 10}
    parking.delivered("a")  # a record acknowledged: everything before it has left
    parking.park("a", 6.0, 15)
    assert parking.parked(6.5) == {"a": 15}
    parking.clear()
    assert parking.parked(6.5) == {}


def test_delivered_all_forgets_each_aggregate_and_reads_nothing_while_none_failed() -> None:
    parking = Parking(first_seconds=1.0, max_seconds=8.0)

    def never_read() -> Iterator[str]:
        raise AssertionError("iterated while no aggregate had failed")
        yield "a"

    parking.delivered_all(never_read())  # the relay's usual batch: nothing to forget
    parking.park("a", 0.0, 10)
    parking.park("b", 0.0, 20)
    parking.delivered_all(iter(["a", "c"]))
    assert parking.parked(0.5) == {"b": 20}
    assert parking.park("a", 1.0, 30) == 1.0  # starts from scratch


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


def test_a_read_that_left_an_aggregate_out_stays_below_its_first_waiting_row() -> None:
    """The read saw nothing of the excluded aggregate: its floor must not rely on holds that
    the sender may release before the floor is applied."""
    horizon = Horizon()
    horizon.observe(last_position=100, xid_bound=10, xmin=11)
    horizon.hold(20)
    candidate = horizon.candidate([30, 31], limit=10, excluded=[20])
    assert candidate == 19
    horizon.release([20])  # sent and acknowledged before the read's floor is applied
    horizon.advance(candidate)
    assert horizon.floor == 19  # rows 21.. of that aggregate are read again
    horizon.advance(horizon.candidate([40], limit=10, excluded=[]))
    assert horizon.floor == 100
