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
    event_id = new_event_id()
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


@pytest.mark.parametrize(
    "event_id",
    [
        uuid.uuid4(),
        uuid.uuid1(),
        uuid.UUID(int=0),
        # Version 7 in its version bits, but not of RFC 9562's variant.
        uuid.UUID("0190c5a8-9c1e-7000-c000-000000000000"),
    ],
    ids=["v4", "v1", "nil", "v7-bits-other-variant"],
)
def test_an_event_id_that_is_not_uuid7_is_refused_with_the_fix(event_id: uuid.UUID) -> None:
    """Consumers sort nothing by it, but the lake dates each event by its id's time: a
    UUIDv4 would land on 1970-01-01 (and outside every ``reconcile --since`` window)."""
    with pytest.raises(EventError, match=r"event_id=.*UUIDv7.*new_event_id\(\)"):
        Event("order", "42", "OrderPlaced", {}, event_id=event_id)


def test_a_uuid7_from_elsewhere_is_accepted() -> None:
    """Any generator's version 7 will do, not only ours (here: uuid_utils' own type)."""
    import uuid_utils

    foreign = uuid.UUID(str(uuid_utils.uuid7()))
    assert Event("order", "42", "OrderPlaced", {}, event_id=foreign).event_id == foreign
