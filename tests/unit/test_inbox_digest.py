"""Copies of one event id with other content are never duplicates: the pure parts (the
content digest, the claim's statements and verdict, the consumer's reason). Against
PostgreSQL: tests/integration/test_inbox_digest.py."""

from __future__ import annotations

import uuid
from collections.abc import Generator
from typing import Any

import pytest

from outbox.consumer import _not_migrated
from outbox.core.contract import record_for
from outbox.core.errors import ConfigurationError, EventError
from outbox.core.kafka_record import content_digest
from outbox.core.protocol import Claim, Rows, claim_message, compare_digests, conflict_reason
from outbox.core.statements import OutboxStatements, Result, Statement
from outbox.core.tables import OutboxTables
from outbox.inbox import ConflictingCopyError

STATEMENTS = OutboxStatements(OutboxTables())
HEADERS = [
    ("id", b"01a20667-c95a-70fb-8d7a-76a0a0312fcb"),
    ("eventType", b"OrderPlaced"),
    ("traceparent", b""),
    ("headers", b"{}"),
    ("position", b"1734"),
]


def run(
    operation: Generator[Statement, Rows, Any], answers: list[Rows]
) -> tuple[list[Statement], Any]:
    """Drive an operation, answering each statement with the next canned rows."""
    seen: list[Statement] = []
    try:
        statement = next(operation)
        while True:
            seen.append(statement)
            statement = operation.send(answers.pop(0))
    except StopIteration as done:
        assert not answers, "statements expected but not run"
        return seen, done.value


def test_the_digest_is_the_one_claims_and_reconcile_keep() -> None:
    """Claims keep digests for their retention: the function must never change (this value
    is reconcile's ``content_digest`` of the same record, when the function moved here)."""
    assert content_digest(b"42", b'{"total": 9.90}', HEADERS) == "cbffd5935e4b424a17f836cb"


def test_the_digest_is_of_the_content_alone() -> None:
    record = record_for(
        event_id=uuid.uuid4(),
        aggregate_type="order",
        aggregate_id="42",
        event_type="OrderPlaced",
        payload_text='{"total": 9.90}',
        headers_text="{}",
        traceparent="",
        position=7,
    )
    digest = content_digest(record.key, record.value, list(record.headers))
    assert digest == content_digest(record.key, record.value, tuple(record.headers))
    assert len(digest) == 24 and int(digest, 16) >= 0


@pytest.mark.parametrize(
    ("key", "value", "headers"),
    [
        (b"43", b'{"total": 9.90}', HEADERS),  # another key
        (None, b'{"total": 9.90}', HEADERS),  # no key
        (b"42", b'{"total": 9.9}', HEADERS),  # another value, equal as a number
        (b"42", None, HEADERS),  # a null value
        (b"42", b'{"total": 9.90}', HEADERS[:-1]),  # a header fewer
        (b"42", b'{"total": 9.90}', [*HEADERS[:2], ("traceparent", None), *HEADERS[3:]]),
        (b"42", b'{"total": 9.90}', [HEADERS[1], HEADERS[0], *HEADERS[2:]]),  # reordered
        (b"42", b'{"total": 9.90}', [("i", b"d" + HEADERS[0][1]), *HEADERS[1:]]),  # shifted
        (b"4", b'2{"total": 9.90}', HEADERS),  # a byte moved from the key to the value
    ],
)
def test_any_other_content_is_another_digest(
    key: bytes | None, value: bytes | None, headers: list[tuple[str, bytes | None]]
) -> None:
    assert content_digest(key, value, headers) != content_digest(b"42", b'{"total": 9.90}', HEADERS)


def test_a_new_claim_is_one_statement_that_keeps_the_digest() -> None:
    seen, claimed = run(claim_message(STATEMENTS, "m", "billing", "d1"), [[(True,)]])
    assert claimed is Claim.NEW
    assert [s.sql for s in seen] == [STATEMENTS.claim_message_with_digest]
    assert seen[0].params == {"consumer": "billing", "message_id": "m", "digest": "d1"}
    assert seen[0].result is Result.ROWS and "digest" in seen[0].sql


def test_a_claim_without_a_digest_is_the_statement_of_before() -> None:
    """It names no column newer than outbox_0001, and a duplicate costs no second statement."""
    for answer, verdict in (([(True,)], Claim.NEW), ([], Claim.DUPLICATE)):
        seen, claimed = run(claim_message(STATEMENTS, "m", "billing"), [answer])
        assert claimed is verdict
        assert [s.sql for s in seen] == [STATEMENTS.claim_message]
        assert "digest" not in seen[0].sql


@pytest.mark.parametrize(
    ("found", "verdict"),
    [
        ([("d1",)], Claim.DUPLICATE),  # the same content
        ([(None,)], Claim.DUPLICATE),  # claimed before digests were kept: unknown, the same
        ([], Claim.DUPLICATE),  # the claim was deleted since: nothing known, nothing written
        ([("d2",)], Claim.CONFLICT),  # other content under the same id
    ],
)
def test_an_existing_claim_is_read_back_once(found: Rows, verdict: Claim) -> None:
    seen, claimed = run(claim_message(STATEMENTS, "m", "billing", "d1"), [[], found])
    assert claimed is verdict
    assert [s.sql for s in seen] == [
        STATEMENTS.claim_message_with_digest,
        STATEMENTS.claimed_digest,
    ]
    assert seen[1].params == {"consumer": "billing", "message_id": "m"}


def test_only_two_known_different_digests_conflict() -> None:
    assert compare_digests("a", "b") is Claim.CONFLICT
    assert compare_digests("a", "a") is Claim.DUPLICATE
    assert compare_digests(None, "a") is Claim.DUPLICATE
    assert compare_digests("a", None) is Claim.DUPLICATE


@pytest.mark.parametrize("digest", ["", "x" * 1025, "a\x00b", "\ud800", b"d1"])
def test_a_digest_that_cannot_be_kept_is_refused(digest: Any) -> None:
    with pytest.raises(EventError, match="digest"):
        next(claim_message(STATEMENTS, "m", "billing", digest))


def test_the_reason_names_the_id_and_why_it_is_no_duplicate() -> None:
    event_id = uuid.uuid4()
    reason = conflict_reason(event_id)
    assert str(event_id) in reason
    assert "copy with other content was handled first" in reason
    assert "reused or forged" in reason
    error = ConflictingCopyError(event_id, "billing")
    assert (error.message_id, error.consumer) == (str(event_id), "billing")
    assert str(error) == f"consumer 'billing': {reason}"


class _Failure(Exception):
    def __init__(self, sqlstate: str) -> None:
        super().__init__(f'column "digest" of relation "outbox_inbox" does not exist ({sqlstate})')
        self.sqlstate = sqlstate


class _Wrapped(Exception):
    """As SQLAlchemy wraps a driver's error: the driver's under ``orig``."""

    def __init__(self, orig: Exception) -> None:
        super().__init__(str(orig))
        self.orig = orig


def test_an_inbox_without_the_digest_column_stops_the_consumer() -> None:
    for error in (_Failure("42703"), _Wrapped(_Failure("42703"))):
        stop = _not_migrated(error)
        assert isinstance(stop, ConfigurationError)
        assert "outbox_0009" in str(stop) and "outbox db upgrade" in str(stop)
    for error in (_Failure("42P01"), _Wrapped(_Failure("40001")), ValueError("x")):
        assert _not_migrated(error) is None
