"""Every text we write to PostgreSQL is storable: no NUL, no lone surrogate (which Python
strings can hold, from JSON's ``"\\ud800"`` or ``surrogateescape``, and which psycopg then
fails to send with ``UnicodeEncodeError``). Pure: the statements are checked, not run."""

from __future__ import annotations

import json
from collections.abc import Generator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from outbox.core.effect_statements import EffectStatements
from outbox.core.effects import BEGIN, COMMIT, LookupAnswer, perform_step
from outbox.core.errors import EffectNotPerformedError
from outbox.core.protocol import dead_letter_message
from outbox.core.statements import OutboxStatements, Statement
from outbox.core.tables import OutboxTables

LONE = "\ud800"  # what json.loads('"\\ud800"') gives
BAD = f"bad {LONE} and \x00 and \udcff"


def storable(value: object) -> bool:
    """As PostgreSQL takes it: text encodable as UTF-8 without NUL, jsonb too."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return False
        return "\x00" not in value and "\\u0000" not in value
    return True


def statements_of(operation: Generator[Any, Any, Any], answers: list[Any]) -> list[Statement]:
    """Drive ``operation``, answering each statement, call and lookup in turn."""
    seen: list[Statement] = []
    try:
        instruction = next(operation)
        while True:
            if isinstance(instruction, Statement):
                seen.append(instruction)
            if instruction in (BEGIN, COMMIT):
                instruction = operation.send(None)
                continue
            answer = answers.pop(0)
            if isinstance(answer, BaseException):
                instruction = operation.throw(answer)
            else:
                instruction = operation.send(answer)
    except StopIteration:
        return seen
    except EffectNotPerformedError:
        return seen


def test_a_consumer_dead_letter_is_storable_whatever_the_reason_and_headers() -> None:
    [statement] = statements_of(
        dead_letter_message(
            OutboxStatements(OutboxTables()),
            consumer="shipping",
            topic="outbox.event.order",
            partition=0,
            offset=7,
            event_id=None,
            key=b"1",
            value=b"{}",
            headers=[(f"name{LONE}\x00", b"\xff\x00")],
            reason=f"ValueError: cannot ship {BAD}",
            attempts=5,
        ),
        [[(1,)]],
    )
    assert all(storable(value) for value in statement.params.values()), statement.params
    assert statement.params["reason"] == "ValueError: cannot ship bad \ufffd and \ufffd and \ufffd"
    assert json.loads(statement.params["headers"]) == [["name\ufffd\ufffd", "\ufffd\ufffd"]]


EFFECTS = EffectStatements(OutboxTables())
# lock_step's row: state, attempt, reference, reason, context (its text), the attempt's start
# and the database's now (an hour later: the attempt has settled, so a lookup's answer is
# acted on).
ATTEMPT_STARTED = datetime(2026, 1, 1, tzinfo=UTC)
STARTED = [("started", 1, None, None, "{}", ATTEMPT_STARTED, ATTEMPT_STARTED + timedelta(hours=1))]
CUT_SHORT = [
    ("started", 2, None, None, "{}", ATTEMPT_STARTED, ATTEMPT_STARTED + timedelta(hours=1))
]


def step() -> Generator[Any, Any, Any]:
    return perform_step(
        EFFECTS,
        consumer="payments",
        event_id="e-1",
        effect="charge",
        context_json="{}",
        can_look_up=True,
    )


@pytest.mark.parametrize(
    "answers",
    [
        # read (none), start (attempt 1), lock: ours; the call certainly did not act
        [[], [(1,)], STARTED, EffectNotPerformedError(BAD), [(1,)]],
        # the call made it: its reference is stored
        [[], [(1,)], STARTED, BAD, [(1,)]],
        # a step cut short: the lookup raises, or cannot tell, or found it
        [[], [], CUT_SHORT, RuntimeError(BAD), [(1,)]],
        [[], [], CUT_SHORT, LookupAnswer.unknown(BAD), [(1,)]],
        [[], [], CUT_SHORT, LookupAnswer.happened(BAD), [(1,)]],
    ],
    ids=["not performed", "reference", "lookup raised", "lookup unknown", "lookup found"],
)
def test_every_text_the_ledger_writes_is_storable(answers: list[Any]) -> None:
    written = statements_of(step(), answers)
    assert written, "nothing was written"
    for statement in written:
        assert all(storable(value) for value in statement.params.values()), statement.params


def test_a_relay_dead_letters_reason_is_storable() -> None:
    from kafka.errors import InvalidTopicError

    from outbox_relay.failures import reason_for

    assert storable(reason_for(InvalidTopicError(BAD)))


def test_text_is_made_storable_by_one_rule() -> None:
    from outbox.core.text import storable_text

    assert storable_text("plain ascii") == "plain ascii"
    assert storable_text(BAD) == "bad \ufffd and \ufffd and \ufffd"
    assert storable_text("\ud83d\ude00") == "\U0001f600", "a split pair is joined"
    assert storable_text("\ufeffbom") == "\ufeffbom"
    assert storable_text(f"x{LONE}yz", max_chars=3) == "x\ufffdy"


@given(st.text(alphabet=st.characters(exclude_categories=()), max_size=50))
def test_storable_text_is_always_storable_and_keeps_what_was(text: str) -> None:
    from outbox.core.text import storable_text

    made = storable_text(text)
    assert storable(made)
    if storable(text):
        assert made == text


def test_names_that_identify_a_row_are_refused_not_changed() -> None:
    from outbox.core.effects import check_step_names
    from outbox.core.errors import EffectError, EventError
    from outbox.core.protocol import claim_message

    with pytest.raises(EffectError, match="lone surrogates"):
        check_step_names("payments", f"e{LONE}", "charge")
    with pytest.raises(EventError, match="lone surrogates"):
        next(claim_message(OutboxStatements(OutboxTables()), "m\x00", "shipping"))
