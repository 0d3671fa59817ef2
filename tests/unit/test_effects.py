"""The side-effect ledger's decisions, driven without a database (pure, no I/O)."""

from __future__ import annotations

import uuid
from collections.abc import Generator
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from outbox.core.effect_statements import EffectStatements
from outbox.core.effects import (
    BEGIN,
    COMMIT,
    Call,
    EffectOutcome,
    Instruction,
    Lookup,
    LookupAnswer,
    Move,
    StepState,
    idempotency_key,
    move_after_lookup,
    next_move,
    perform_step,
)
from outbox.core.errors import EffectError, EffectNotPerformedError
from outbox.core.statements import Statement
from outbox.core.tables import OutboxTables

STATEMENTS = EffectStatements(OutboxTables())
EVENT = "0195f3c2-0000-7000-8000-000000000001"


def operation(*, can_look_up: bool = False) -> Generator[Instruction, Any, EffectOutcome]:
    return perform_step(
        STATEMENTS,
        consumer="payments",
        event_id=EVENT,
        effect="charge",
        context_json='{"amount": 5}',
        can_look_up=can_look_up,
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
            else:
                seen.append(instruction.value)
            if instruction in (BEGIN, COMMIT):
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


def locked(state: str, attempt: int, reference: str | None = None) -> list[tuple[Any, ...]]:
    return [(state, attempt, reference, None, {"amount": 5})]


def test_a_new_step_is_committed_as_started_before_the_call_and_done_after() -> None:
    seen, outcome = run(operation(), [[], [(1,)], locked("started", 1), "pay-1", [(1,)]])
    assert seen == [
        "begin", "read_step", "start_step", "commit",  # started, committed: before the call
        "begin", "lock_step", "call", "mark_done", "commit",
    ]  # fmt: skip
    assert outcome.done and outcome.called and outcome.reference == "pay-1"
    assert outcome.step.context == {"amount": 5} and outcome.step.attempt == 1


def test_a_done_step_is_skipped() -> None:
    seen, outcome = run(operation(), [locked("done", 1, "pay-1")])
    assert seen == ["begin", "read_step", "commit"]  # nothing written, nothing locked
    assert outcome.done and not outcome.called
    assert outcome.reference == "pay-1"


def test_a_cut_short_step_without_lookup_is_parked_not_called() -> None:
    seen, outcome = run(operation(), [locked("started", 1), locked("started", 1), [(1,)]])
    assert seen[-2:] == ["park_step", "commit"] and "call" not in seen
    assert outcome.needs_decision and str(outcome.step.idempotency_key) in outcome.reason


def test_a_lookup_that_found_it_marks_it_done_without_calling() -> None:
    answers = [locked("started", 1), locked("started", 1), LookupAnswer.happened("pay-9"), [(1,)]]
    seen, outcome = run(operation(can_look_up=True), answers)
    assert "call" not in seen and "lookup" in seen
    assert outcome.done and outcome.reference == "pay-9" and not outcome.called


def test_a_lookup_that_did_not_find_it_starts_a_new_attempt_then_calls() -> None:
    answers = [
        locked("started", 1), locked("started", 1), LookupAnswer.not_happened(), [(2,)],
        locked("started", 2), "pay-2", [(1,)],
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
        run(operation(can_look_up=True), [locked("started", 1), locked("started", 1), "pay-1"])


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
    started = locked("started", 1)
    answers = [started, started, ConnectionError("provider down"), [(1,)]]
    seen, outcome = run(operation(can_look_up=True), answers)
    assert "call" not in seen and seen[-2:] == ["park_step", "commit"]
    assert outcome.needs_decision and "ConnectionError: provider down" in outcome.reason


def test_a_parked_step_is_returned_as_it_is_without_a_lock() -> None:
    parked = [("needs_decision", 1, None, "cut short", {"amount": 5})]
    seen, outcome = run(operation(can_look_up=True), [parked])
    assert seen == ["begin", "read_step", "commit"]
    assert outcome.needs_decision and outcome.reason == "cut short"
