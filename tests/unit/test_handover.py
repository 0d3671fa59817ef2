"""Auto mode's takeover and step-back decisions (pure)."""

from __future__ import annotations

import uuid

from outbox_relay.handover import Handover


def ids(n: int) -> list[uuid.UUID]:
    return [uuid.uuid4() for _ in range(n)]


def test_fresh_rows_are_left_to_cdc() -> None:
    handover = Handover(grace_seconds=5)
    rows = ids(3)
    assert not handover.should_publish(rows, now=100.0)
    assert not handover.should_publish(rows, now=104.9)
    assert handover.takeovers == 0


def test_a_row_older_than_the_grace_period_makes_the_relay_take_over() -> None:
    handover = Handover(grace_seconds=5)
    old = ids(1)
    assert not handover.should_publish(old, now=100.0)
    newer = ids(2)
    assert handover.should_publish(old + newer, now=105.0)
    assert handover.publishing and handover.takeovers == 1
    # While publishing, everything read is published, fresh or not.
    assert handover.should_publish(ids(2), now=105.1)


def test_it_steps_back_only_after_a_cdc_heartbeat_newer_than_the_takeover() -> None:
    handover = Handover(grace_seconds=5)
    rows = ids(1)
    handover.should_publish(rows, now=100.0)
    handover.cdc_heartbeat(101.0)
    assert handover.should_publish(rows, now=106.0)
    assert not handover.drained()  # the heartbeat predates the takeover
    handover.cdc_heartbeat(107.0)
    assert handover.drained()
    assert not handover.publishing and handover.stepbacks == 1
    assert not handover.should_publish(ids(1), now=108.0)  # fresh again: CDC's


def test_rows_that_were_delivered_are_forgotten() -> None:
    handover = Handover(grace_seconds=5)
    first = ids(1)
    handover.should_publish(first, now=100.0)
    later = ids(1)
    # ``first`` was delivered by CDC (no longer read); ``later`` is new at 104.
    assert not handover.should_publish(later, now=104.0)
    assert not handover.should_publish(later, now=108.0)
    assert handover.should_publish(later, now=109.0)


def test_the_grace_period_ignores_wall_clock_steps() -> None:
    """Measured on the monotonic clock: an NTP step forward does not make the relay take
    over, and the takeover time kept for heartbeats is the wall clock's."""
    handover = Handover(grace_seconds=5)
    rows = ids(1)
    assert not handover.should_publish(rows, now=100.0, wall_now=1_000.0)
    assert not handover.should_publish(rows, now=101.0, wall_now=9_000.0)  # stepped forward
    assert handover.should_publish(rows, now=105.0, wall_now=500.0)  # stepped back
    assert handover.took_over_at == 500.0
    handover.cdc_heartbeat(600.0)
    assert handover.drained()
