"""The operator's side of the side-effect ledger: steps that need a decision, and decisions.

A step is parked (``needs_decision``) when its call was cut short and nobody could tell
whether the third party acted. Ask the third party about the step's idempotency key, then:

- :func:`mark_done` when it did act (with its reference): the step is never called again;
- :func:`release` when it did not: one more attempt may call, with the same key
  (``Effects.perform_released``, or the event's next delivery).

Both apply only to a parked step; anything else raises :class:`EffectStateError`, so two
operators deciding at once cannot both win. ``outbox effects`` is the command line for them.
These take a sync transaction (the caller commits), like ``Inbox``.
"""

from __future__ import annotations

import uuid
from collections.abc import Generator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from outbox._drivers import drive, sync_executor
from outbox.core.effect_statements import EffectStatements
from outbox.core.effects import check_step_names, stored_context
from outbox.core.errors import EffectStateError
from outbox.core.protocol import Rows
from outbox.core.statements import Result, Statement
from outbox.core.text import storable_text
from outbox.settings import OutboxSettings

__all__ = [
    "DecisionSummary",
    "ParkedStep",
    "decision_summary",
    "mark_done",
    "release",
    "steps_needing_decision",
]


@dataclass(frozen=True, slots=True)
class ParkedStep:
    consumer: str
    event_id: str
    effect: str
    idempotency_key: uuid.UUID
    attempt: int
    context: Any
    reason: str | None
    started_at: datetime
    parked_at: datetime


@dataclass(frozen=True, slots=True)
class DecisionSummary:
    """One consumer's parked steps: how many, and how long the oldest has waited."""

    consumer: str
    steps: int
    oldest_age_seconds: float


def _statements(settings: OutboxSettings | None) -> EffectStatements:
    return EffectStatements((settings if settings is not None else OutboxSettings()).tables)


def steps_needing_decision(
    transaction: object,
    *,
    consumer: str | None = None,
    limit: int = 100,
    settings: OutboxSettings | None = None,
) -> list[ParkedStep]:
    """Parked steps, oldest first (of one consumer, or of all)."""
    params = {"consumer": consumer, "limit": limit}
    rows = drive(
        _rows(_statements(settings).steps_needing_decision, params), sync_executor(transaction)
    )
    return [
        ParkedStep(consumer, event_id, effect, key, attempt, stored_context(context), *times)
        for consumer, event_id, effect, key, attempt, context, *times in rows
    ]


def decision_summary(
    transaction: object, *, settings: OutboxSettings | None = None
) -> list[DecisionSummary]:
    """Per consumer with parked steps: their count and the oldest one's age."""
    rows = drive(_rows(_statements(settings).decision_summary, {}), sync_executor(transaction))
    return [DecisionSummary(row[0], int(row[1]), float(row[2])) for row in rows]


def mark_done(
    transaction: object,
    *,
    consumer: str,
    event_id: str | uuid.UUID,
    effect: str,
    reference: str | None,
    settings: OutboxSettings | None = None,
) -> None:
    """Decide that the third party did act: the step is done, with its ``reference``."""
    names = _names(consumer, event_id, effect)
    stored = None if reference is None else storable_text(reference)
    params = {**names, "reference": stored, "reason": "marked done by an operator"}
    _decide(transaction, _statements(settings).decide_done, params)


def release(
    transaction: object,
    *,
    consumer: str,
    event_id: str | uuid.UUID,
    effect: str,
    settings: OutboxSettings | None = None,
) -> None:
    """Decide that the third party did not act: one more attempt may call it."""
    params = {**_names(consumer, event_id, effect), "reason": "released by an operator"}
    _decide(transaction, _statements(settings).decide_release, params)


def _names(consumer: str, event_id: str | uuid.UUID, effect: str) -> dict[str, str]:
    consumer, event_text, effect = check_step_names(consumer, event_id, effect)
    return {"consumer": consumer, "event_id": event_text, "effect": effect}


def _decide(transaction: object, sql: str, params: dict[str, Any]) -> None:
    if not drive(_rows(sql, params), sync_executor(transaction)):
        raise EffectStateError(
            f"no step {params['consumer']}/{params['event_id']}/{params['effect']} needs a "
            "decision: check the names with `outbox effects list` (a step that is done, "
            "started or already released cannot be decided)"
        )


def _rows(sql: str, params: dict[str, Any]) -> Generator[Statement, Rows, Rows]:
    rows = yield Statement(sql, params, Result.ROWS)
    return rows
