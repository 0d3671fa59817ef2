"""The SDK's decisions, driven without a database (pure generators, no I/O)."""

from __future__ import annotations

import json
from collections.abc import Generator
from datetime import timedelta
from typing import Any

import pytest

from outbox import DedupKeyUnavailableError, Event, EventError
from outbox.core.protocol import (
    Claim,
    Rows,
    claim_message,
    in_lock_order,
    publish_events,
    single_row_event,
    single_row_values,
)
from outbox.core.statements import (
    ROW_PARAMETERS,
    OutboxStatements,
    Result,
    Statement,
    to_named_style,
)
from outbox.core.tables import OutboxTables

STATEMENTS = OutboxStatements(OutboxTables())


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
        return seen, done.value


def publish(events: list[Event], answers: list[Rows]) -> tuple[list[Statement], Any]:
    operation = publish_events(
        STATEMENTS, events, max_payload_bytes=10_000, dedup_window=timedelta(hours=24)
    )
    return run(operation, answers)


def test_a_batch_without_keys_is_one_statement_that_waits_for_nothing() -> None:
    events = [Event("order", str(n % 3), "E", {"n": n}) for n in range(10)]
    seen, results = publish(events, [[]])
    assert len(seen) == 1 and seen[0].result is Result.NOTHING
    assert [r.event_id for r in results] == [e.event_id for e in events]
    assert not any(r.duplicate for r in results)


def test_one_event_is_one_row_of_values_carrying_every_field() -> None:
    event = Event(
        "order",
        "id-1-é",
        "E",
        {"text": 'é"\\'},
        headers={"tenant": 'a"b'},
        traceparent="00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
    )
    seen, results = publish([event], [[]])
    assert len(seen) == 1 and seen[0].result is Result.NOTHING
    assert seen[0].sql == STATEMENTS.insert_event
    assert seen[0].params == {
        "id": event.event_id,
        "aggregatetype": "order",
        "aggregateid": "id-1-é",
        "type": "E",
        "payload": json.dumps(event.payload, ensure_ascii=False, separators=(",", ":")),
        "headers": json.dumps(dict(event.headers), separators=(",", ":")),
        "traceparent": event.traceparent,
    }
    assert [r.event_id for r in results] == [event.event_id]
    untraced = Event("order", "1", "E", {})
    seen, _ = publish([untraced], [[]])
    assert seen[0].params["traceparent"] == "" and seen[0].params["headers"] == "{}"


@pytest.mark.parametrize("size", [2, 4, 100])
def test_the_batch_carries_every_field_in_lock_order(size: int) -> None:
    events = [
        Event(
            ("order", "customer")[n % 2],
            f"id-{size - n}-é",
            f"E{n}",
            {"n": n, "text": 'é"\\'},
            headers={"tenant": 'a"b'} if n % 2 else {},
            traceparent="00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01" if n else None,
            dedup_key=f"k{n}" if n % 3 else None,
        )
        for n in range(size)
    ]
    seen, _ = publish(events, [[(e.event_id,) for e in events]])
    rows = json.loads(seen[0].params["batch"])
    assert len(rows) == size
    by_id = {str(e.event_id): e for e in events}
    for row in rows:
        event = by_id[row["id"]]
        assert row == {
            "id": str(event.event_id),
            "aggregatetype": event.aggregate_type,
            "aggregateid": event.aggregate_id,
            "type": event.event_type,
            "payload": event.payload,
            "headers": dict(event.headers),
            "traceparent": event.traceparent or "",  # "" is "none" in the table
            "dedup_key": event.dedup_key,
        }
    keys = [(row["aggregatetype"], row["aggregateid"]) for row in rows]
    assert keys == sorted(keys)


def test_only_one_event_without_a_key_is_a_single_row() -> None:
    """The shortcut of the adapters (one row of VALUES, nothing to read back) is taken for
    exactly the calls ``publish_events`` answers with ``insert_event``."""
    plain = Event("order", "1", "E", {"n": 1}, headers={"tenant": "t"})
    assert single_row_event([plain]) is plain
    assert single_row_event([Event("order", "1", "E", {}, dedup_key="k")]) is None
    assert single_row_event([plain, plain]) is None
    assert single_row_event([]) is None
    seen, _ = publish([plain], [[]])
    values = single_row_values(plain, max_payload_bytes=10_000)
    assert seen[0].params == dict(zip(ROW_PARAMETERS, values, strict=True))
    assert STATEMENTS.insert_event_positional.count("%s") == len(ROW_PARAMETERS)


def test_lock_order_keeps_each_aggregates_own_order() -> None:
    events = [Event("order", str(n % 2), f"E{n}", {}) for n in range(6)]
    ordered = in_lock_order(events)
    assert [e.event_type for e in ordered if e.aggregate_id == "0"] == ["E0", "E2", "E4"]
    assert [e.event_type for e in ordered if e.aggregate_id == "1"] == ["E1", "E3", "E5"]


def test_live_keys_are_reported_as_duplicates_of_the_original() -> None:
    new = Event("order", "1", "Paid", {}, dedup_key="fresh")
    repeated = Event("order", "1", "Paid", {}, dedup_key="seen")
    original_id = Event("order", "1", "Paid", {}).event_id
    seen, results = publish([new, repeated], [[(new.event_id,)], [("seen", original_id)]])
    assert [s.result for s in seen] == [Result.ROWS, Result.ROWS]
    assert seen[1].params == {"dedup_keys": ["seen"]}
    assert results[0].event_id == new.event_id and not results[0].duplicate
    assert results[1].event_id == original_id and results[1].duplicate


def test_a_live_key_this_role_cannot_see_is_refused_not_reported_as_a_duplicate() -> None:
    """Nothing was inserted and the key's row is not visible (another role's key, or one
    deleted just now): reporting a duplicate would drop the event silently."""
    foreign = Event("invoice", "1", "Sent", {}, dedup_key="pay-1")
    with pytest.raises(DedupKeyUnavailableError, match="'pay-1': held by another"):
        publish([foreign], [[], []])


def test_objects_that_are_not_events_are_refused() -> None:
    with pytest.raises(EventError, match=r"events\[1\]"):
        publish([Event("order", "1", "E", {}), {"type": "E"}], [[]])  # type: ignore[list-item]


def test_claim_checks_its_arguments() -> None:
    with pytest.raises(EventError, match="consumer"):
        run(claim_message(STATEMENTS, "m", ""), [])
    seen, new = run(claim_message(STATEMENTS, "m", "billing"), [[(True,)]])
    assert new is Claim.NEW and seen[0].params == {"consumer": "billing", "message_id": "m"}


def test_named_style_for_sqlalchemy() -> None:
    assert to_named_style("a = %(x)s AND b = %(y_1)s") == "a = :x AND b = :y_1"


def keyed_publish() -> Generator[Statement, Rows, Any]:
    """A publish of one event with a dedup key, at its first statement (the keyed insert)."""
    operation = publish_events(
        STATEMENTS,
        [Event("invoice", "1", "Sent", {}, dedup_key="pay-1")],
        max_payload_bytes=1_000_000,
        dedup_window=timedelta(hours=1),
    )
    next(operation)
    return operation


class _ServerError(Exception):
    """Stands for a driver's error: what the core reads of it is ``sqlstate``."""

    def __init__(self, sqlstate: str, message: str) -> None:
        super().__init__(message)
        self.sqlstate = sqlstate


class _Wrapped(Exception):
    """Stands for SQLAlchemy's wrapper: the driver's error is ``orig``."""

    def __init__(self, orig: Exception) -> None:
        super().__init__(str(orig))
        self.orig = orig


@pytest.mark.parametrize("wrap", [False, True])
def test_a_row_security_refusal_of_a_key_is_the_same_error_as_a_skipped_key(wrap: bool) -> None:
    """Newer PostgreSQL releases raise a row-level security violation where older ones
    skipped another role's live key: both reach the caller as DedupKeyUnavailableError."""
    operation = keyed_publish()
    refusal: Exception = _ServerError(
        "42501", 'new row violates row-level security policy for table "outbox_dedup"'
    )
    with pytest.raises(DedupKeyUnavailableError, match="'pay-1': held by another") as raised:
        operation.throw(_Wrapped(refusal) if wrap else refusal)
    assert raised.value.__cause__ is not None


def test_other_errors_of_the_dedup_statement_reach_the_caller_as_they_are() -> None:
    operation = keyed_publish()
    denied = _ServerError("42501", "permission denied for table outbox_dedup")
    with pytest.raises(_ServerError, match="permission denied"):
        operation.throw(denied)


@pytest.mark.parametrize(
    "message",
    [
        # row_security = off for a role the policy applies to: retrying cannot help
        'query would be affected by row-level security policy for table "outbox_dedup"',
        # another table's policy (an earlier statement's error, reported here in a pipeline)
        'new row violates row-level security policy for table "orders"',
    ],
)
def test_row_security_errors_of_other_kinds_or_tables_are_not_a_held_key(message: str) -> None:
    operation = keyed_publish()
    with pytest.raises(_ServerError, match="row-level security"):
        operation.throw(_ServerError("42501", message))
