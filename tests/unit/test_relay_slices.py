"""How relays split the outbox's slices among themselves (pure: relay/outbox_relay/slices.py)."""

from __future__ import annotations

import uuid

from hypothesis import given
from hypothesis import strategies as st

from outbox_relay.slices import SLICES, Shares, describe, fair_share, plan


@given(st.sets(st.uuids(), min_size=1, max_size=70))
def test_the_shares_add_up_to_every_slice_and_differ_by_one_at_most(
    members: set[uuid.UUID],
) -> None:
    shares = [fair_share(members, member) for member in members]
    assert sum(shares) == SLICES
    assert max(shares) - min(shares) <= 1


def test_a_relay_not_yet_counted_counts_itself() -> None:
    others = {uuid.UUID(int=1), uuid.UUID(int=2)}
    assert fair_share(others, uuid.UUID(int=3)) == 10  # 11, 11, 10: the lowest ids get more
    assert fair_share(others, uuid.UUID(int=0)) == 11
    assert fair_share(set(), uuid.UUID(int=3)) == SLICES


def test_above_its_share_a_relay_hands_back_its_highest_slices() -> None:
    held = set(range(16))
    assert plan(held, 11, free=0) == Shares(release=(11, 12, 13, 14, 15))
    assert plan(held, 11, free=16) == Shares(release=(11, 12, 13, 14, 15)), "never takes then"


def test_below_its_share_a_relay_takes_what_is_free_up_to_it() -> None:
    assert plan({0, 1}, 11, free=5) == Shares(take=5)
    assert plan({0, 1}, 11, free=30) == Shares(take=9)
    assert not plan(set(range(11)), 11, free=21), "at its share: nothing to do"
    assert not plan(set(), 0, free=32), "a relay with no member lease takes nothing"


def test_a_relay_that_needs_every_slice_takes_them_all_or_none() -> None:
    assert plan(set(), 11, free=SLICES, whole=True) == Shares(take=SLICES)
    assert plan({1, 2}, 11, free=30, whole=True) == Shares(take=30)
    assert not plan(set(), 11, free=SLICES - 1, whole=True), "one is held elsewhere: none"
    assert not plan(set(range(SLICES)), 1, free=0, whole=True), "holds all: releases none"


def test_the_logs_name_runs_of_slices() -> None:
    assert describe([0, 1, 2, 3, 7, 9, 10]) == "0-3, 7, 9-10"
    assert describe([]) == "none"
