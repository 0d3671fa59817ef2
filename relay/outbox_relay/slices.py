"""How relays share the outbox: slices of aggregates, each relayed by one relay at a time.

An aggregate's *slice* is a hash of its type and id modulo :data:`SLICES`, computed by the
server (relay/outbox_relay/statements.py), so every relay agrees on it without being told.
A relay publishes only the rows of the slices whose lease it holds, in position order: an
aggregate's events keep their order because one relay at a time sends them, as one leader
sent everything before.

Every running relay also holds one of :data:`MEMBERS` *member* leases: the live members are
how many relays share the work, and each takes its fair share (:func:`fair_share`). A relay
joins, the others release what is above their new share and it takes what is free; a relay
dies, its session's leases become free at once and the others take them.

A relay changes its slices only between batches (nothing in flight: the batch sent last is
acknowledged and deleted first), so a slice released is never sent by two relays at once,
and a slice taken is read from its lowest row (the read floor starts again).

This module is pure: the relay feeds it who lives and what it holds, it answers with numbers.
"""

from __future__ import annotations

import uuid
from collections.abc import Collection, Iterable
from dataclasses import dataclass

__all__ = ["MEMBERS", "SLICES", "Shares", "describe", "fair_share", "plan"]

SLICES = 32
"""Slices of the outbox's aggregates (the migration outbox_0011 allows ``slice 0`` to
``slice 99``; changing this needs every relay stopped first)."""
MEMBERS = 64
"""Relays that can share the work at once; one more stands by until one of them ends."""


def fair_share(members: Collection[uuid.UUID], me: uuid.UUID, *, slices: int = SLICES) -> int:
    """How many slices ``me`` should hold among the live ``members`` (itself included, or
    it counts as one more): the shares differ by one at most and add up to ``slices``, the
    larger ones going to the lowest ids, so that every relay computes the same split."""
    everyone = sorted({*members, me})
    base, rest = divmod(slices, len(everyone))
    return base + (1 if everyone.index(me) < rest else 0)


@dataclass(frozen=True)
class Shares:
    """What a relay should do with its slices (nothing when both are empty)."""

    release: tuple[int, ...] = ()
    """Held slices to hand back (the highest numbers: the others keep theirs)."""
    take: int = 0
    """How many free slices to take."""

    def __bool__(self) -> bool:
        return bool(self.release) or self.take > 0


def plan(held: Collection[int], target: int, free: int, *, whole: bool = False) -> Shares:
    """From the slices ``held``, the fair ``target`` and the number of ``free`` slices: what
    to release or take. ``whole``: the relay works only with every slice (it follows CDC's
    one stream, auto and cleanup modes): it takes all that are free, releases none."""
    if whole:
        return Shares(take=free if len(held) + free >= SLICES and len(held) < SLICES else 0)
    if len(held) > target:
        return Shares(release=tuple(sorted(held)[target:]))
    return Shares(take=min(target - len(held), free))


def describe(slices: Iterable[int]) -> str:
    """``0-10, 15`` for the logs: runs of consecutive slices."""
    runs: list[list[int]] = []
    for number in sorted(slices):
        if runs and number == runs[-1][1] + 1:
            runs[-1][1] = number
        else:
            runs.append([number, number])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs) or "none"
