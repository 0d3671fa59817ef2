"""The side-effect ledger's decisions: effects on systems we do not control, at most once.

A *step* is one call to a third party, named ``(consumer, event_id, effect)``. Invariants:

1. A step is committed as ``started`` (its own short transaction) **before** its call, with
   an ``attempt`` number; the call runs while that attempt holds the step's row lock, in a
   second transaction that marks it ``done`` with the third party's reference. A crash
   anywhere leaves the step ``started`` (or ``done``), never absent after a call.
2. A ``done`` step is never called again; a ``needs_decision`` step is never called again
   until an operator releases it.
3. A ``started`` step whose attempt is not the caller's own, once its lock is free, was cut
   short (a crash, or an error after the call began): nobody knows whether the third party
   acted. It is **never** called blindly. A lookup (ask the third party about the step's
   idempotency key) resolves it: *happened* marks it done, *unknown* (or a lookup that
   raises) parks it, and *did not happen* starts a new attempt and calls **only once the
   attempt has settled**: ``settle_after`` (the effect declares it) has passed since the
   attempt started. Before that a "not found" proves nothing (the call may still be in
   flight, or the third party may not have recorded it yet): the step waits (at most
   ``max_wait``) and is looked up again, or is parked (:func:`move_after_not_found`). Both
   times are the database's clock: ``updated_at`` of a started step is when its current
   attempt began, and the lock reads ``clock_timestamp()``. Without a lookup it is parked as
   ``needs_decision``, so the partition moves on and nothing is called twice.
4. A call that raises :class:`EffectNotPerformedError` certainly did not act: the step is
   ``released`` and may be called again. Any other exception leaves it ``started`` (3).
5. Every step has one idempotency key for life (:func:`idempotency_key`), sent with each
   call, so a third party that deduplicates makes even a released retry harmless.

Rejected: calling inside the consumer's inbox transaction (a crash after the call rolls the
claim back and the redelivery calls again), and lease timeouts for "in progress" (a slow
call outlives its lease and gets a twin). The row lock ends exactly when its holder does.
The settle time is no lease: it never lets a call start while another holds the step; it
only says how long after an attempt started a lookup's "not found" cannot be trusted.

The operation is a generator of instructions (statements, transaction bounds, the call,
the lookup) that does no I/O; ``outbox.effects`` drives it, sync or async.
"""

from __future__ import annotations

import enum
import uuid
from collections.abc import Generator, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from outbox.core.contract import load_strict_json
from outbox.core.effect_statements import EffectStatements
from outbox.core.errors import EffectError, EffectNotPerformedError
from outbox.core.statements import Result, Statement
from outbox.core.text import MAX_REASON_CHARS, is_storable, storable_text

Rows = Sequence[Sequence[Any]]

__all__ = [
    "BEGIN",
    "COMMIT",
    "DEFAULT_MAX_WAIT",
    "DEFAULT_SETTLE_AFTER",
    "Call",
    "EffectOutcome",
    "EffectStep",
    "Instruction",
    "Lookup",
    "LookupAnswer",
    "Move",
    "Settling",
    "StepState",
    "TransactionBound",
    "Wait",
    "check_max_wait",
    "check_settle_after",
    "idempotency_key",
    "move_after_lookup",
    "move_after_not_found",
    "next_move",
    "perform_step",
]

# Fixed for ever: changing it would change every step's key.
_KEY_NAMESPACE = uuid.UUID("6f1d8f0e-3c52-5b8a-9a57-0e4d2c1b7a31")
_MAX_ROUNDS = 16  # a step changes hands at most this often in one call before we give up

# How long after an attempt started a lookup's "not found" is not trusted, unless the effect
# says otherwise: a third party that finishes (or drops) a request within about half a
# minute of receiving it, and whose lookup shows what it did at once (docs/side-effects.md).
DEFAULT_SETTLE_AFTER = timedelta(seconds=30)
# How long ``perform`` may wait for an attempt to settle before it parks the step instead:
# a consumer's poll loop must not stall past Kafka's max.poll.interval.ms (300 s by default)
# over its retries (IdempotentConsumer: 5 attempts).
DEFAULT_MAX_WAIT = timedelta(seconds=30)
_SETTLE_AFTER_LIMIT = timedelta(days=30)
_MAX_WAIT_LIMIT = timedelta(hours=1)


class StepState(enum.Enum):
    STARTED = "started"
    DONE = "done"
    NEEDS_DECISION = "needs_decision"
    RELEASED = "released"


class _Answer(enum.Enum):
    HAPPENED = "happened"
    NOT_HAPPENED = "not_happened"
    UNKNOWN = "unknown"


@dataclass(frozen=True, slots=True)
class LookupAnswer:
    """What the third party said about a step's idempotency key: build it with the helpers."""

    answer: _Answer
    reference: str | None = None
    reason: str = ""

    @classmethod
    def happened(cls, reference: str | None) -> LookupAnswer:
        """The request with this key was performed; ``reference`` is the third party's id."""
        return cls(_Answer.HAPPENED, reference)

    @classmethod
    def not_happened(cls) -> LookupAnswer:
        """The third party has no request with this key (yet): it is called again once the
        attempt has settled (``settle_after`` since it started), and not before."""
        return cls(_Answer.NOT_HAPPENED)

    @classmethod
    def unknown(cls, reason: str = "the lookup could not tell") -> LookupAnswer:
        """No way to know now: the step is parked for an operator."""
        return cls(_Answer.UNKNOWN, reason=reason)


@dataclass(frozen=True, slots=True)
class EffectStep:
    """What a call and a lookup get: the step, its key and its stored context."""

    consumer: str
    event_id: str
    effect: str
    idempotency_key: uuid.UUID
    attempt: int
    context: Any
    """The ``context`` given to ``perform``, read back as JSON (as an event's payload is:
    numbers with a fraction or an exponent are exact ``Decimal``)."""


@dataclass(frozen=True, slots=True)
class EffectOutcome:
    """Where a step stands after ``perform``. ``called``: this invocation made the call."""

    step: EffectStep
    state: StepState
    reference: str | None
    called: bool
    reason: str | None = None

    @property
    def done(self) -> bool:
        return self.state is StepState.DONE

    @property
    def needs_decision(self) -> bool:
        return self.state is StepState.NEEDS_DECISION


class TransactionBound(enum.Enum):
    BEGIN = "begin"
    COMMIT = "commit"


BEGIN = TransactionBound.BEGIN
COMMIT = TransactionBound.COMMIT


@dataclass(frozen=True, slots=True)
class Call:
    """Make the call now; send back its reference (``str`` or ``None``) or throw its error."""

    step: EffectStep


@dataclass(frozen=True, slots=True)
class Lookup:
    """Ask the third party about ``step``; send back a :class:`LookupAnswer` or throw its error."""

    step: EffectStep


@dataclass(frozen=True, slots=True)
class Wait:
    """Sleep this many seconds (no transaction is open), then send back ``None``."""

    seconds: float


Instruction = Statement | TransactionBound | Call | Lookup | Wait


class Move(enum.Enum):
    CALL = "call"  # the caller's own attempt holds the lock: call
    RETURN_DONE = "return_done"
    RETURN_PARKED = "return_parked"
    LOOKUP = "lookup"  # an attempt was cut short: ask the third party
    PARK = "park"  # an attempt was cut short and nobody can tell: park it
    RESTART = "restart"  # commit a new attempt, then call
    MARK_DONE = "mark_done"  # the lookup found it: record the reference
    WAIT = "wait"  # "not found", but the attempt has not settled: wait, then look again


@dataclass(frozen=True, slots=True)
class Settling:
    """What a lookup's "not found" about a cut-short attempt leads to, and why.

    ``move``: ``RESTART`` (it has settled: call again), ``WAIT`` (for ``wait``, then look
    again) or ``PARK``. ``elapsed``: since the attempt started, by the database's clock.
    """

    move: Move
    elapsed: timedelta
    wait: timedelta = timedelta(0)


def idempotency_key(consumer: str, event_id: str, effect: str) -> uuid.UUID:
    """The step's key for life: a UUIDv5 of consumer, event id and effect name."""
    return uuid.uuid5(_KEY_NAMESPACE, f"{consumer}\x1f{event_id}\x1f{effect}")


def next_move(state: StepState, attempt: int, my_attempt: int | None, *, can_look_up: bool) -> Move:
    """What to do with a step whose row lock we now hold."""
    if state is StepState.DONE:
        return Move.RETURN_DONE
    if state is StepState.NEEDS_DECISION:
        return Move.RETURN_PARKED
    if state is StepState.RELEASED:
        return Move.RESTART
    if my_attempt == attempt:
        return Move.CALL
    return Move.LOOKUP if can_look_up else Move.PARK


def move_after_lookup(answer: LookupAnswer) -> Move:
    """``RESTART`` for "not found" means: only once settled (:func:`move_after_not_found`)."""
    if answer.answer is _Answer.HAPPENED:
        return Move.MARK_DONE
    if answer.answer is _Answer.NOT_HAPPENED:
        return Move.RESTART
    return Move.PARK


def move_after_not_found(
    attempt_started_at: datetime,
    now: datetime,
    settle_after: timedelta,
    max_wait: timedelta,
) -> Settling:
    """May a cut-short attempt that the lookup did not find be made again, now?

    Only once ``settle_after`` has passed since the attempt started: before that, the call
    may still be in flight or not yet recorded by the third party, and a second call could
    be a second charge. Otherwise wait for the rest when it is at most ``max_wait``, or
    park. Both times are the database's clock; one that reads earlier than the attempt's
    start (it was set back) cannot tell how long ago that was: park.
    """
    elapsed = now - attempt_started_at
    if elapsed < timedelta(0):
        return Settling(Move.PARK, elapsed)
    if elapsed >= settle_after:
        return Settling(Move.RESTART, elapsed)
    rest = settle_after - elapsed
    return Settling(Move.WAIT if rest <= max_wait else Move.PARK, elapsed, rest)


def check_settle_after(settle_after: object) -> timedelta:
    """The effect's settle time, or :class:`EffectError` saying what it must be."""
    if isinstance(settle_after, timedelta) and timedelta(0) < settle_after <= _SETTLE_AFTER_LIMIT:
        return settle_after
    raise EffectError(
        f"settle_after={settle_after!r} must be a timedelta above 0 and at most 30 days, "
        "e.g. timedelta(seconds=30): how long after a call starts the third party may "
        "still perform or record it (docs/side-effects.md, 'The settle time')"
    )


def check_max_wait(max_wait: object) -> timedelta:
    """How long ``perform`` may wait for a step to settle, or :class:`EffectError`."""
    if isinstance(max_wait, timedelta) and timedelta(0) <= max_wait <= _MAX_WAIT_LIMIT:
        return max_wait
    raise EffectError(
        f"max_wait={max_wait!r} must be a timedelta from 0 to 1 hour, e.g. "
        "timedelta(seconds=30): a longer wait stalls the consumer (park the step instead)"
    )


_CUT_SHORT = (
    "attempt {attempt} started and did not finish (a crash, or an error after the call "
    "began): the third party may or may not have acted. Ask it about idempotency key {key}, "
    "then `outbox effects mark-done` (it did) or `outbox effects release` (it did not)"
)
_NOT_SETTLED = (
    "the lookup did not find it, but attempt {attempt} started only {elapsed:.1f} s before, "
    "less than the effect's settle time ({settle:.0f} s): the call may still land. Ask "
    "again after {settles_at} (the database's clock), then decide; "
)
_CLOCK_BACK = (
    "the lookup did not find it, but the database's clock reads {elapsed:.1f} s earlier "
    "than attempt {attempt}'s start: how long ago it started cannot be told; "
)


def _not_settled_reason(
    settling: Settling, attempt: int, started_at: datetime, settle_after: timedelta
) -> str:
    if settling.elapsed < timedelta(0):
        return _CLOCK_BACK.format(elapsed=-settling.elapsed.total_seconds(), attempt=attempt)
    return _NOT_SETTLED.format(
        attempt=attempt,
        elapsed=settling.elapsed.total_seconds(),
        settle=settle_after.total_seconds(),
        settles_at=(started_at + settle_after).isoformat(),
    )


def check_step_names(consumer: object, event_id: object, effect: object) -> tuple[str, str, str]:
    """The step's names as text, or :class:`EffectError` naming the bad one and the fix."""
    if not isinstance(consumer, str) or not consumer or len(consumer) > 255:
        raise EffectError(
            f"consumer={consumer!r} must be a non-empty str of at most 255 characters"
        )
    if isinstance(event_id, uuid.UUID):
        event_id = str(event_id)
    if not isinstance(event_id, str) or not event_id or len(event_id) > 1024:
        raise EffectError(
            f"event_id={event_id!r} must be a UUID or a non-empty str of at most 1024 characters"
        )
    if not isinstance(effect, str) or not effect or len(effect) > 255:
        raise EffectError(f"effect={effect!r} must be a non-empty str of at most 255 characters")
    for name, value in (("consumer", consumer), ("event_id", event_id), ("effect", effect)):
        if not is_storable(value):  # a name identifies the step: refused, never changed
            raise EffectError(f"{name}={value!r} must not hold NUL or lone surrogates")
    return consumer, event_id, effect


def _reason(text: str) -> str:
    """A reason as the ledger stores it: storable, at most MAX_REASON_CHARS."""
    return storable_text(text, max_chars=MAX_REASON_CHARS)


def _reference(reference: object) -> str | None:
    """The third party's reference as stored: its text, storable (not cut: it is an id)."""
    return None if reference is None else storable_text(str(reference))


def perform_step(
    statements: EffectStatements,
    *,
    consumer: str,
    event_id: str,
    effect: str,
    context_json: str,
    can_look_up: bool,
    settle_after: timedelta = DEFAULT_SETTLE_AFTER,
    max_wait: timedelta = DEFAULT_MAX_WAIT,
) -> Generator[Instruction, Any, EffectOutcome]:
    """Perform one step at most once (see the module's invariants); return where it stands."""
    consumer, event_id, effect = check_step_names(consumer, event_id, effect)
    settle_after = check_settle_after(settle_after)
    max_wait = check_max_wait(max_wait)
    key = idempotency_key(consumer, event_id, effect)
    names = {"consumer": consumer, "event_id": event_id, "effect": effect}
    yield BEGIN
    # Read first: a redelivery of a done (or parked) step ends here, with nothing written.
    existing = yield Statement(statements.read_step, names, Result.ROWS)
    started: Rows = []
    if not existing:
        started = yield Statement(
            statements.start_step, {**names, "key": key, "context": context_json}, Result.ROWS
        )
    yield COMMIT
    if existing:
        state_text, attempt, reference, reason, context = existing[0]
        step = EffectStep(consumer, event_id, effect, key, attempt, stored_context(context))
        if state_text == StepState.DONE.value:
            return EffectOutcome(step, StepState.DONE, reference, called=False)
        if state_text == StepState.NEEDS_DECISION.value:
            return EffectOutcome(step, StepState.NEEDS_DECISION, None, called=False, reason=reason)
    # Ours when we inserted it (attempt 1); otherwise started or released by someone else.
    mine: int | None = started[0][0] if started else None
    for _ in range(_MAX_ROUNDS):
        yield BEGIN
        rows = yield Statement(statements.lock_step, names, Result.ROWS)
        if not rows:
            raise EffectError(
                f"step {consumer}/{event_id}/{effect} vanished while it was performed: "
                "was it deleted by hand?"
            )
        # attempt_started_at: when the step's current attempt began (while it is started).
        state_text, attempt, reference, reason, context, attempt_started_at, now = rows[0]
        state = StepState(state_text)
        step = EffectStep(consumer, event_id, effect, key, attempt, stored_context(context))
        move = next_move(state, attempt, mine, can_look_up=can_look_up)
        answer: LookupAnswer | None = None
        settling: Settling | None = None
        if move is Move.LOOKUP:
            try:
                answer = yield Lookup(step)
            except Exception as error:  # the third party cannot be asked now: nobody knows
                answer = LookupAnswer.unknown(f"the lookup raised {type(error).__name__}: {error}")
            if not isinstance(answer, LookupAnswer):
                raise EffectError(
                    f"the lookup returned {answer!r}: return LookupAnswer.happened(reference), "
                    "LookupAnswer.not_happened() or LookupAnswer.unknown(reason)"
                )
            move = move_after_lookup(answer)
            if move is Move.RESTART:  # "not found": to be trusted only once settled
                settling = move_after_not_found(attempt_started_at, now, settle_after, max_wait)
                move = settling.move
        if move is Move.CALL:
            try:
                made = yield Call(step)
            except EffectNotPerformedError as error:
                release = {**names, "reason": _reason(f"not performed: {error}")}
                yield Statement(statements.release_step, release, Result.ROWCOUNT)
                yield COMMIT
                raise
            made = _reference(made)
            yield Statement(
                statements.mark_done, {**names, "reference": made, "reason": None}, Result.ROWCOUNT
            )
            yield COMMIT
            return EffectOutcome(step, StepState.DONE, made, called=True)
        if move is Move.RESTART:
            restarted = yield Statement(statements.restart_step, names, Result.ROWS)
            yield COMMIT
            mine = restarted[0][0]
            continue
        if move is Move.MARK_DONE:
            assert answer is not None
            found = _reference(answer.reference)
            marked = {**names, "reference": found, "reason": "found by the lookup"}
            yield Statement(statements.mark_done, marked, Result.ROWCOUNT)
            yield COMMIT
            return EffectOutcome(step, StepState.DONE, found, called=False)
        if move is Move.WAIT:
            assert settling is not None
            yield COMMIT  # the lock is not held while we wait: another may resolve the step
            yield Wait(settling.wait.total_seconds())
            continue
        if move is Move.PARK:
            why = _CUT_SHORT.format(attempt=attempt, key=key)
            if settling is not None:
                why = _not_settled_reason(settling, attempt, attempt_started_at, settle_after) + why
            elif answer is not None:
                why = f"the lookup could not tell ({answer.reason}); {why}"
            parked = {**names, "reason": _reason(why)}
            yield Statement(statements.park_step, parked, Result.ROWCOUNT)
            yield COMMIT
            return EffectOutcome(step, StepState.NEEDS_DECISION, None, called=False, reason=why)
        yield COMMIT
        if move is Move.RETURN_DONE:
            return EffectOutcome(step, StepState.DONE, reference, called=False)
        return EffectOutcome(step, StepState.NEEDS_DECISION, None, called=False, reason=reason)
    raise EffectError(
        f"step {consumer}/{event_id}/{effect} changed hands {_MAX_ROUNDS} times in one call: "
        "are several consumers releasing it in a loop?"
    )


def stored_context(text: str | None) -> Any:
    """A step's context as read back (``context::text``): JSON with exact numbers."""
    return None if text is None else load_strict_json(text, exact=True)
