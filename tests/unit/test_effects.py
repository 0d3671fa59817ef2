"""The side-effect ledger's decisions, driven without a database (pure, no I/O)."""

from __future__ import annotations

import uuid
from collections.abc import Generator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from outbox.core.effect_statements import EffectStatements
from outbox.core.effects import (
    BEGIN,
    COMMIT,
    DEFAULT_MAX_WAIT,
    DEFAULT_SETTLE_AFTER,
    Call,
    EffectOutcome,
    Instruction,
    Lookup,
    LookupAnswer,
    Move,
    StepState,
    Wait,
    idempotency_key,
    move_after_lookup,
    move_after_not_found,
    next_move,
    perform_step,
)
from outbox.core.errors import EffectError, EffectNotPerformedError
from outbox.core.statements import Statement
from outbox.core.tables import OutboxTables

STATEMENTS = EffectStatements(OutboxTables())
EVENT = "0195f3c2-0000-7000-8000-000000000001"


SETTLE = timedelta(seconds=30)
CONTEXT_TEXT = '{"amount": 5}'  # the stored context as the database gives it (context::text)
STARTED_AT = datetime(2026, 11, 24, 12, 0, tzinfo=UTC)  # the attempt's start, as the database says


def operation(
    *, can_look_up: bool = False, max_wait: timedelta = timedelta(seconds=30)
) -> Generator[Instruction, Any, EffectOutcome]:
    return perform_step(
        STATEMENTS,
        consumer="payments",
        event_id=EVENT,
        effect="charge",
        context_json='{"amount": 5}',
        can_look_up=can_look_up,
        settle_after=SETTLE,
        max_wait=max_wait,
    )


def run(
    op: Generator[Instruction, Any, EffectOutcome],
    answers: list[Any],
    seen: list[str] | None = None,
) -> tuple[list[str], Any]:
    """Drive ``op``: answer statements, calls and lookups in turn; name what it asked for.

    An answer that is an exception is thrown into the operation (a call that raised).
    """
    seen = [] if seen is None else seen
    reply: Any = None
    try:
        instruction = next(op)
        while True:
            if isinstance(instruction, Statement):
                seen.append(_statement_name(instruction.sql))
            elif isinstance(instruction, Call | Lookup):
                seen.append(type(instruction).__name__.lower())
            elif isinstance(instruction, Wait):
                seen.append(f"wait {instruction.seconds:g}")
            else:
                seen.append(instruction.value)
            if instruction in (BEGIN, COMMIT) or isinstance(instruction, Wait):
                instruction = op.send(None)
                continue
            reply = answers.pop(0)
            throw = isinstance(reply, BaseException)
            instruction = op.throw(reply) if throw else op.send(reply)
    except StopIteration as done:
        return seen, done.value


def _statement_name(sql: str) -> str:
    for attribute in ("read_step", "start_step", "lock_step", "mark_done", "restart_step"):
        if sql == getattr(STATEMENTS, attribute):
            return attribute
    if sql in (STATEMENTS.release_step, STATEMENTS.park_step):
        return "release_step" if sql == STATEMENTS.release_step else "park_step"
    raise AssertionError(f"unexpected statement {sql}")


def locked(
    state: str, attempt: int, reference: str | None = None, *, age: float = 3600
) -> list[tuple[Any, ...]]:
    """``lock_step``'s row: the attempt began ``age`` seconds before the database's now."""
    now = STARTED_AT + timedelta(seconds=age)
    return [(state, attempt, reference, None, CONTEXT_TEXT, STARTED_AT, now)]


def test_a_new_step_is_committed_as_started_before_the_call_and_done_after() -> None:
    seen, outcome = run(operation(), [[], [(1,)], locked("started", 1), "pay-1", [(1,)]])
    assert seen == [
        "begin", "read_step", "start_step", "commit",  # started, committed: before the call
        "begin", "lock_step", "call", "mark_done", "commit",
    ]  # fmt: skip
    assert outcome.done and outcome.called and outcome.reference == "pay-1"
    assert outcome.step.context == {"amount": 5} and outcome.step.attempt == 1


def read(state: str, attempt: int, reference: str | None = None) -> list[tuple[Any, ...]]:
    """``read_step``'s row."""
    return [(state, attempt, reference, None, CONTEXT_TEXT)]


def test_a_done_step_is_skipped() -> None:
    seen, outcome = run(operation(), [read("done", 1, "pay-1")])
    assert seen == ["begin", "read_step", "commit"]  # nothing written, nothing locked
    assert outcome.done and not outcome.called
    assert outcome.reference == "pay-1"


def test_a_cut_short_step_without_lookup_is_parked_not_called() -> None:
    seen, outcome = run(operation(), [read("started", 1), locked("started", 1), [(1,)]])
    assert seen[-2:] == ["park_step", "commit"] and "call" not in seen
    assert outcome.needs_decision and str(outcome.step.idempotency_key) in outcome.reason


def test_a_lookup_that_found_it_marks_it_done_without_calling() -> None:
    answers = [read("started", 1), locked("started", 1), LookupAnswer.happened("pay-9"), [(1,)]]
    seen, outcome = run(operation(can_look_up=True), answers)
    assert "call" not in seen and "lookup" in seen
    assert outcome.done and outcome.reference == "pay-9" and not outcome.called


def test_a_lookup_that_did_not_find_a_settled_attempt_starts_a_new_one_then_calls() -> None:
    answers = [
        read("started", 1), locked("started", 1), LookupAnswer.not_happened(), [(2,)],
        locked("started", 2, age=0), "pay-2", [(1,)],
    ]  # fmt: skip
    seen, outcome = run(operation(can_look_up=True), answers)
    restart = seen.index("restart_step")
    assert seen[restart + 1] == "commit" and seen.index("call") > restart + 1
    assert outcome.called and outcome.step.attempt == 2


def test_a_call_that_certainly_failed_releases_the_step_and_raises() -> None:
    failure = EffectNotPerformedError("refused")
    seen: list[str] = []
    with pytest.raises(EffectNotPerformedError):
        run(operation(), [[], [(1,)], locked("started", 1), failure, [(1,)]], seen)
    assert seen[-3:] == ["call", "release_step", "commit"]


def test_another_error_from_the_call_leaves_the_step_started() -> None:
    seen: list[str] = []
    with pytest.raises(TimeoutError):
        answers = [[], [(1,)], locked("started", 1), TimeoutError("read timed out")]
        run(operation(), answers, seen)
    assert seen[-1] == "call"  # no mark, no commit: the driver rolls the lock back


def test_a_lookup_must_answer_with_a_lookup_answer() -> None:
    with pytest.raises(EffectError, match=r"LookupAnswer\.happened"):
        run(operation(can_look_up=True), [read("started", 1), locked("started", 1), "pay-1"])


def test_the_move_table() -> None:
    assert next_move(StepState.DONE, 1, 1, can_look_up=True) is Move.RETURN_DONE
    assert next_move(StepState.NEEDS_DECISION, 1, None, can_look_up=True) is Move.RETURN_PARKED
    assert next_move(StepState.RELEASED, 1, None, can_look_up=False) is Move.RESTART
    assert next_move(StepState.STARTED, 2, 2, can_look_up=False) is Move.CALL
    assert next_move(StepState.STARTED, 2, 1, can_look_up=True) is Move.LOOKUP
    assert next_move(StepState.STARTED, 2, None, can_look_up=False) is Move.PARK
    assert move_after_lookup(LookupAnswer.happened("r")) is Move.MARK_DONE
    assert move_after_lookup(LookupAnswer.not_happened()) is Move.RESTART
    assert move_after_lookup(LookupAnswer.unknown()) is Move.PARK


@given(
    state=st.sampled_from(StepState),
    attempt=st.integers(1, 5),
    mine=st.none() | st.integers(1, 5),
    can_look_up=st.booleans(),
)
def test_only_the_callers_own_started_attempt_is_ever_called(
    state: StepState, attempt: int, mine: int | None, can_look_up: bool
) -> None:
    move = next_move(state, attempt, mine, can_look_up=can_look_up)
    if move is Move.CALL:
        assert state is StepState.STARTED and mine == attempt


def test_the_idempotency_key_is_stable_and_names_the_step() -> None:
    key = idempotency_key("payments", EVENT, "charge")
    assert key == idempotency_key("payments", EVENT, "charge") and key.version == 5
    # Fixed for ever: a changed key would let a third party see a retry as a new request.
    assert key == uuid.UUID("bdb737aa-bb00-5114-afd3-a2f6e5e3d647")
    others = {
        idempotency_key("shipping", EVENT, "charge"),
        idempotency_key("payments", EVENT, "refund"),
        idempotency_key("payments", EVENT.replace("1", "2"), "charge"),
        idempotency_key("payments", EVENT + "\x1fcharge", ""),
    }
    assert key not in others and len(others) == 4


@pytest.mark.parametrize(
    ("consumer", "event_id", "effect", "field"),
    [
        ("", EVENT, "charge", "consumer"),
        ("p", "", "charge", "event_id"),
        ("p", EVENT, "", "effect"),
    ],
)
def test_bad_step_names_are_refused_by_name(
    consumer: str, event_id: str, effect: str, field: str
) -> None:
    op = perform_step(
        STATEMENTS,
        consumer=consumer,
        event_id=event_id,
        effect=effect,
        context_json="null",
        can_look_up=False,
    )
    with pytest.raises(EffectError, match=field):
        next(op)


def test_a_lookup_that_raises_parks_the_step_with_the_error() -> None:
    answers = [read("started", 1), locked("started", 1), ConnectionError("provider down"), [(1,)]]
    seen, outcome = run(operation(can_look_up=True), answers)
    assert "call" not in seen and seen[-2:] == ["park_step", "commit"]
    assert outcome.needs_decision and "ConnectionError: provider down" in outcome.reason


def test_a_parked_step_is_returned_as_it_is_without_a_lock() -> None:
    parked = [("needs_decision", 1, None, "cut short", CONTEXT_TEXT)]
    seen, outcome = run(operation(can_look_up=True), [parked])
    assert seen == ["begin", "read_step", "commit"]
    assert outcome.needs_decision and outcome.reason == "cut short"


def test_a_not_found_before_the_attempt_settled_waits_then_asks_again() -> None:
    """Issue 22: a call that timed out may still land: "not found" 5 s after it is no proof."""
    answers = [
        read("started", 1), locked("started", 1, age=5), LookupAnswer.not_happened(),
        locked("started", 1, age=30.2), LookupAnswer.happened("pay-late"), [(1,)],
    ]  # fmt: skip
    seen, outcome = run(operation(can_look_up=True), answers)
    assert seen == [
        "begin", "read_step", "commit",
        "begin", "lock_step", "lookup", "commit", "wait 25",  # the lock is let go to wait
        "begin", "lock_step", "lookup", "mark_done", "commit",
    ]  # fmt: skip
    assert outcome.done and not outcome.called and outcome.reference == "pay-late"


def test_a_not_found_after_the_wait_calls_again() -> None:
    answers = [
        read("started", 1), locked("started", 1, age=29), LookupAnswer.not_happened(),
        locked("started", 1, age=30), LookupAnswer.not_happened(), [(2,)],
        locked("started", 2, age=0), "pay-2", [(1,)],
    ]  # fmt: skip
    seen, outcome = run(operation(can_look_up=True), answers)
    assert seen.count("wait 1") == 1 and seen.count("call") == 1
    assert seen.index("call") > seen.index("restart_step") > seen.index("wait 1")
    assert outcome.called and outcome.step.attempt == 2


def test_a_not_found_too_long_before_settling_parks_the_step_with_when_to_ask() -> None:
    answers = [read("started", 1), locked("started", 1, age=5), LookupAnswer.not_happened(), [(1,)]]
    seen, outcome = run(operation(can_look_up=True, max_wait=timedelta(seconds=10)), answers)
    assert "call" not in seen and "restart_step" not in seen and not any("wait" in s for s in seen)
    assert seen[-2:] == ["park_step", "commit"] and outcome.needs_decision
    assert outcome.reason is not None and "settle time (30 s)" in outcome.reason
    assert (STARTED_AT + SETTLE).isoformat() in outcome.reason
    assert str(outcome.step.idempotency_key) in outcome.reason


def test_the_settle_decision() -> None:
    start = STARTED_AT
    wait = timedelta(seconds=10)
    after = move_after_not_found
    assert after(start, start + SETTLE, SETTLE, wait).move is Move.RESTART  # settled
    assert after(start, start + timedelta(days=3), SETTLE, wait).move is Move.RESTART
    soon = after(start, start + timedelta(seconds=25), SETTLE, wait)
    assert soon.move is Move.WAIT and soon.wait == timedelta(seconds=5)
    assert after(start, start + timedelta(seconds=20), SETTLE, wait).move is Move.WAIT
    assert after(start, start + timedelta(seconds=19), SETTLE, wait).move is Move.PARK
    assert after(start, start, SETTLE, timedelta(0)).move is Move.PARK  # never waits
    assert after(start, start - timedelta(seconds=1), SETTLE, SETTLE).move is Move.PARK  # clock
    assert DEFAULT_MAX_WAIT >= DEFAULT_SETTLE_AFTER  # by default a retry waits, never parks


@given(
    started=st.datetimes(timezones=st.just(UTC)),
    elapsed=st.timedeltas(timedelta(seconds=-60), timedelta(days=40)),
    settle=st.timedeltas(timedelta(microseconds=1), timedelta(days=30)),
    max_wait=st.timedeltas(timedelta(0), timedelta(hours=1)),
)
def test_a_not_found_is_acted_on_only_once_the_attempt_has_settled(
    started: datetime, elapsed: timedelta, settle: timedelta, max_wait: timedelta
) -> None:
    settling = move_after_not_found(started, started + elapsed, settle, max_wait)
    assert settling.move in (Move.RESTART, Move.WAIT, Move.PARK)
    if settling.move is Move.RESTART:
        assert elapsed >= settle
    if settling.move is Move.WAIT:
        assert timedelta(0) < settling.wait <= max_wait and elapsed + settling.wait == settle


@pytest.mark.parametrize(
    ("settle_after", "max_wait", "field"),
    [
        (timedelta(0), timedelta(0), "settle_after"),
        (30, timedelta(0), "settle_after"),
        (timedelta(days=31), timedelta(0), "settle_after"),
        (SETTLE, timedelta(seconds=-1), "max_wait"),
        (SETTLE, timedelta(hours=2), "max_wait"),
        (SETTLE, 5.0, "max_wait"),
    ],
)
def test_a_bad_settle_time_or_wait_is_refused_by_name(
    settle_after: Any, max_wait: Any, field: str
) -> None:
    op = perform_step(
        STATEMENTS,
        consumer="payments",
        event_id=EVENT,
        effect="charge",
        context_json="null",
        can_look_up=True,
        settle_after=settle_after,
        max_wait=max_wait,
    )
    with pytest.raises(EffectError, match=f"{field}=.*timedelta"):
        next(op)


def test_done_steps_are_kept_as_long_as_dead_letters_and_inbox_claims(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 22: done steps went after 7 days while dead letters stay 30: a late replay of a
    dead letter called the third party again. One is derived from the other now."""
    from outbox.effects import Effects
    from outbox.settings import OutboxSettings

    settings = OutboxSettings()
    assert settings.dead_letter_retention == timedelta(days=30)
    assert settings.effect_retention >= settings.dead_letter_retention
    assert settings.effect_retention >= settings.inbox_retention
    monkeypatch.setenv("OUTBOX_DEAD_LETTER_RETENTION", "P90D")
    monkeypatch.setenv("OUTBOX_INBOX_RETENTION", "86400")
    assert OutboxSettings().effect_retention == timedelta(days=90)
    monkeypatch.setenv("OUTBOX_INBOX_RETENTION", str(100 * 86400))
    assert OutboxSettings().effect_retention == timedelta(days=100)
    monkeypatch.setenv("OUTBOX_DEAD_LETTER_RETENTION", "0")
    with pytest.raises(ValueError, match="dead_letter_retention"):
        OutboxSettings()

    def no_transaction() -> Any:
        raise AssertionError("refused before any transaction")

    ledger = Effects(consumer="payments", begin=no_transaction, settings=settings)
    with pytest.raises(EffectError, match="OUTBOX_DEAD_LETTER_RETENTION"):
        ledger.delete_expired(older_than=timedelta(days=7))
