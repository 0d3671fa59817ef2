"""Event validation: every bad field is refused with a message that names it."""

from __future__ import annotations

import time
import uuid

import pytest

from outbox import Event, EventError, new_event_id


def test_event_ids_are_time_ordered_uuid7() -> None:
    first = new_event_id()
    time.sleep(0.002)  # ids are ordered by their millisecond: cross one
    second = new_event_id()
    assert first.version == 7 and second.version == 7
    assert first < second


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"aggregate_type": "order events"}, "aggregate_type"),
        ({"aggregate_type": ""}, "aggregate_type"),
        ({"aggregate_id": ""}, "aggregate_id"),
        ({"aggregate_id": 42}, "aggregate_id must be a str"),
        ({"event_type": "x" * 256}, "event_type"),
        ({"dedup_key": ""}, "dedup_key"),
        ({"traceparent": "not-a-trace"}, "traceparent"),
        ({"headers": {"bad name": "v"}}, "header name"),
        ({"headers": {"id": "v"}}, "set by the outbox"),
        ({"headers": {"tenant": 1}}, "headers"),
        ({"event_id": "0190-not-a-uuid"}, "event_id"),
    ],
)
def test_invalid_fields_are_named(fields: dict[str, object], named: str) -> None:
    arguments: dict[str, object] = {
        "aggregate_type": "order",
        "aggregate_id": "42",
        "event_type": "OrderPlaced",
        "payload": {},
    }
    arguments.update(fields)
    with pytest.raises(EventError, match=named):
        Event(**arguments)  # type: ignore[arg-type]


def test_a_valid_event_keeps_its_fields() -> None:
    event_id = uuid.uuid4()
    event = Event(
        "order.v2",
        "42",
        "OrderPlaced",
        {"a": 1},
        headers={"tenant": "acme"},
        traceparent="00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        dedup_key="k",
        event_id=event_id,
    )
    assert (event.aggregate_type, event.event_id, event.headers) == (
        "order.v2",
        event_id,
        {"tenant": "acme"},
    )
