"""The SDK's decisions as generators that do no I/O.

Each operation is a generator that yields the :class:`Statement` s to run and receives their
rows (as the statement's ``result`` asks); its return value is the operation's result. The
sync and async adapters only drive these generators: they differ in how they wait, never in
what they decide.
"""

from __future__ import annotations

import enum
import json
import uuid
from collections.abc import Generator, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from outbox.core.errors import DedupKeyUnavailableError, EventError
from outbox.core.event import Event, PublishResult
from outbox.core.payload import encode_json
from outbox.core.statements import (
    ROW_PARAMETERS,
    EventRow,
    OutboxStatements,
    Result,
    Statement,
    encode_batch,
)
from outbox.core.text import MAX_REASON_CHARS, is_storable, storable_text

__all__ = [
    "Claim",
    "Rows",
    "attached_batch",
    "attached_rows",
    "claim_message",
    "conflict_reason",
    "delete_expired",
    "publish_events",
    "single_row_event",
    "single_row_values",
]

Rows = Sequence[Sequence[Any]]
Operation = Generator[Statement, Rows, Any]


@dataclass(frozen=True, slots=True)
class _BatchPlan:
    """The events that go to the database, and the ones already known to be duplicates."""

    events: list[Event]
    # index in the caller's list -> index of the earlier event in the same call with that key
    duplicates_in_call: dict[int, int]


def plan_batch(events: Sequence[Event]) -> _BatchPlan:
    """Drop, from one call, every event whose dedup key an earlier event of the call has."""
    first_with_key: dict[str, int] = {}
    duplicates: dict[int, int] = {}
    to_write: list[Event] = []
    for index, event in enumerate(events):
        if not isinstance(event, Event):
            raise EventError(f"events[{index}] is a {type(event).__name__}, not an outbox.Event")
        key = event.dedup_key
        if key is not None:
            if key in first_with_key:
                duplicates[index] = first_with_key[key]
                continue
            first_with_key[key] = index
        to_write.append(event)
    return _BatchPlan(to_write, duplicates)


def in_lock_order(events: Sequence[Event]) -> list[Event]:
    """The events sorted by aggregate, keeping each aggregate's events in the caller's order.

    The outbox trigger locks each aggregate as its first row is inserted; inserting in one
    global order means two concurrent batches never wait for each other in a cycle. Only
    the order *within* an aggregate is a promise, and a stable sort keeps it.
    """
    if len(events) < 2:
        return list(events)
    return sorted(events, key=lambda event: (event.aggregate_type, event.aggregate_id))


def _rows(events: Sequence[Event], max_payload_bytes: int) -> list[EventRow]:
    return [
        EventRow(
            event.event_id,
            event.aggregate_type,
            event.aggregate_id,
            event.event_type,
            encode_json(event.payload, max_bytes=max_payload_bytes),
            encode_json(dict(event.headers), root="headers") if event.headers else "{}",
            event.traceparent or "",  # '' is "none": the column is NOT NULL (outbox_0003)
            event.dedup_key,
        )
        for event in events
    ]


def _row_params(row: EventRow) -> dict[str, Any]:
    return dict(zip(ROW_PARAMETERS, row.values(), strict=True))


def single_row_event(events: Sequence[Event]) -> Event | None:
    """The event of the commonest publish, one event without a dedup key (one row of
    ``VALUES``, its result known before the server answers); None for any other call."""
    if len(events) == 1 and type(event := events[0]) is Event and event.dedup_key is None:
        return event
    return None


def single_row_values(event: Event, *, max_payload_bytes: int) -> tuple[Any, ...]:
    """The values of ``event``'s row in :data:`ROW_PARAMETERS` order, built directly (the
    commonest publish: no batch to plan, sort or take apart)."""
    headers = event.headers
    return (
        event.event_id,
        event.aggregate_type,
        event.aggregate_id,
        event.event_type,
        encode_json(event.payload, max_bytes=max_payload_bytes),
        encode_json(dict(headers), root="headers") if headers else "{}",
        event.traceparent or "",  # '' is "none": the column is NOT NULL (outbox_0003)
    )


def publish_events(
    statements: OutboxStatements,
    events: Sequence[Event],
    *,
    max_payload_bytes: int,
    dedup_window: timedelta,
) -> Generator[Statement, Rows, list[PublishResult]]:
    """Write ``events`` in one statement; one more only when dedup keys turned out live."""
    event = single_row_event(events)
    if event is not None:  # the commonest call: one row, its values bound as they are
        values = single_row_values(event, max_payload_bytes=max_payload_bytes)
        yield Statement(
            statements.insert_event, dict(zip(ROW_PARAMETERS, values, strict=True)), Result.NOTHING
        )
        return [PublishResult(event.event_id)]
    plan = plan_batch(events)
    if not plan.events:
        return []
    rows = _rows(in_lock_order(plan.events), max_payload_bytes)
    if len(rows) == 1 and rows[0].dedup_key is None:
        # The commonest call: one row, its values bound as they are (no batch to take apart).
        yield Statement(statements.insert_event, _row_params(rows[0]), Result.NOTHING)
        return [PublishResult(events[0].event_id)]
    batch = encode_batch(rows)
    if not any(row.dedup_key is not None for row in rows):
        # No key: the outcome is known, so rows are not fetched and a pipelined
        # connection need not wait for the server here.
        yield Statement(statements.insert_events, {"batch": batch}, Result.NOTHING)
        return [PublishResult(event.event_id) for event in events]

    params = {"batch": batch, "dedup_window_seconds": dedup_window.total_seconds()}
    try:
        inserted_rows = yield Statement(statements.insert_events_with_dedup, params, Result.ROWS)
    except Exception as error:
        if is_row_security_refusal(error, statements.tables.dedup):
            # PostgreSQL checks a conflicting key's row against row-level security before
            # the ON CONFLICT condition (seen on 15.20: a back-patched fix); earlier minor
            # releases (15.18) skipped another role's live key silently (handled below).
            live = [row.dedup_key for row in rows if row.dedup_key is not None]
            raise DedupKeyUnavailableError(_held_elsewhere(", ".join(map(repr, live)))) from error
        raise
    inserted: set[uuid.UUID] = {row[0] for row in inserted_rows}
    original_by_key: dict[str, uuid.UUID] = {}
    live_keys = [
        row.dedup_key for row in rows if row.dedup_key is not None and row.event_id not in inserted
    ]
    if live_keys:
        found = yield Statement(statements.find_dedup_keys, {"dedup_keys": live_keys}, Result.ROWS)
        original_by_key = {row[0]: row[1] for row in found}

    results: list[PublishResult] = []
    for index, event in enumerate(events):
        if index in plan.duplicates_in_call:
            first = results[plan.duplicates_in_call[index]]
            results.append(PublishResult(first.event_id, duplicate=True))
        elif event.dedup_key is None or event.event_id in inserted:
            results.append(PublishResult(event.event_id))
        else:
            # The key is live. Its row is not visible when another role holds it (row-level
            # security: keys belong to the role that wrote them), or when a cleanup deleted
            # it just now: either way nothing was written, and saying "duplicate" would
            # drop the event silently.
            original = original_by_key.get(event.dedup_key)
            if original is None:
                raise DedupKeyUnavailableError(_held_elsewhere(repr(event.dedup_key)))
            results.append(PublishResult(original, duplicate=True))
    return results


def _held_elsewhere(keys: str) -> str:
    return (
        f"dedup key(s) {keys}: held by another database role (keys belong to the role that "
        "wrote them; prefix them with your service, e.g. 'orders:<key>'), or it expired and "
        "was deleted just now (publish again): the event was not written; roll back"
    )


def is_row_security_refusal(error: BaseException, table: str) -> bool:
    """A row of ``table`` refused by its row-level security policy (SQLSTATE 42501, "new row
    violates row-level security policy ... for table "<table>""), raised by psycopg or
    wrapped by SQLAlchemy (``.orig``). Not ``row_security = off`` ("query would be
    affected by ..."), nor a policy of another table (an earlier statement's error that a
    pipeline reports here). A server whose messages are translated is not recognised: its
    error reaches the caller as it is."""
    cause = getattr(error, "orig", None) or error
    message = str(cause)
    return (
        getattr(cause, "sqlstate", None) == "42501"
        and "violates row-level security policy" in message
        and f'for table "{table}"' in message
    )


def attached_rows(events: Sequence[Event], *, max_payload_bytes: int) -> list[EventRow]:
    """The rows of events that ride along with the caller's own statement, in lock order.

    Such a statement returns the caller's rows, not ours, so it cannot tell which dedup keys
    were live: events with a dedup key are refused here (publish them with ``publish``).
    """
    plan = plan_batch(events)
    for index, event in enumerate(events):
        if event.dedup_key is not None:
            raise EventError(
                f"events[{index}] has a dedup_key: execute() cannot report duplicates, so "
                "publish events with dedup keys through publish() or publish_many()"
            )
    return _rows(in_lock_order(plan.events), max_payload_bytes)


def attached_batch(events: Sequence[Event], *, max_payload_bytes: int) -> str:
    """The batch parameter for events that ride along with the caller's own statement."""
    return encode_batch(attached_rows(events, max_payload_bytes=max_payload_bytes))


class Claim(enum.Enum):
    """What an inbox claim found."""

    NEW = "new"
    """The message was not claimed before: process it."""
    DUPLICATE = "duplicate"
    """Claimed before, with the same content (or content not known on one side): skip it."""
    CONFLICT = "conflict"
    """Claimed before with other content: the id was reused or forged. Not a duplicate:
    never process it, set it aside (:func:`conflict_reason`)."""


MAX_DIGEST_CHARS = 1024


def claim_message(
    statements: OutboxStatements,
    message_id: str | uuid.UUID,
    consumer: str,
    digest: str | None = None,
) -> Generator[Statement, Rows, Claim]:
    """Record ``(consumer, message_id)`` and, when given, the ``digest`` of the message's
    content; say whether it is new, a duplicate or a conflicting copy.

    A new claim is one statement. An existing one is a duplicate without a second
    statement when ``digest`` is None; with a digest, one more statement reads the claim's:
    a different one is a conflict. A claim kept without a digest (written before
    outbox_0009, or by a caller that gave none) is taken as the same content.
    """
    if (
        not isinstance(consumer, str)
        or not consumer
        or len(consumer) > 255
        or not is_storable(consumer)
    ):
        raise EventError(
            f"consumer={consumer!r} must be a non-empty str of at most 255 characters, "
            "without NUL or lone surrogates"
        )
    if isinstance(message_id, uuid.UUID):
        message_id = str(message_id)
    if (
        not isinstance(message_id, str)
        or not message_id
        or len(message_id) > 1024
        or not is_storable(message_id)
    ):
        raise EventError(
            f"message_id={message_id!r} must be a UUID or a non-empty str of at most 1024 "
            "characters, without NUL or lone surrogates"
        )
    if digest is not None and (
        not isinstance(digest, str)
        or not digest
        or len(digest) > MAX_DIGEST_CHARS
        or not is_storable(digest)
    ):
        raise EventError(
            f"digest={digest!r} must be None or a non-empty str of at most "
            f"{MAX_DIGEST_CHARS} characters, without NUL or lone surrogates"
        )
    key = {"consumer": consumer, "message_id": message_id}
    if digest is None:
        rows = yield Statement(statements.claim_message, key, Result.ROWS)
        return Claim.NEW if rows else Claim.DUPLICATE
    rows = yield Statement(
        statements.claim_message_with_digest, {**key, "digest": digest}, Result.ROWS
    )
    if rows:
        return Claim.NEW
    found = yield Statement(statements.claimed_digest, key, Result.ROWS)
    return compare_digests(None if not found else found[0][0], digest)


def compare_digests(claimed: str | None, digest: str | None) -> Claim:
    """An existing claim's verdict: a duplicate unless both digests are known and differ.
    (``claimed`` is None too when the claim was deleted since it was found: nothing is
    known of it, and nothing was written.)"""
    if claimed is None or digest is None or claimed == digest:
        return Claim.DUPLICATE
    return Claim.CONFLICT


def conflict_reason(message_id: str | uuid.UUID) -> str:
    """Why a conflicting copy was set aside, for a dead letter or an error message."""
    return (
        f"event id {message_id}: a copy with other content was handled first (the id was "
        "reused or forged); this copy is no duplicate, and was not applied"
    )


def dead_letter_message(
    statements: OutboxStatements,
    *,
    consumer: str,
    topic: str,
    partition: int,
    offset: int,
    event_id: str | None,
    key: bytes | None,
    value: bytes | None,
    headers: Sequence[tuple[str, bytes | None]],
    reason: str,
    attempts: int,
) -> Generator[Statement, Rows, None]:
    """Keep a record a consumer could not handle, with the reason, for ops to look at.

    Whatever the record and the reason hold, what is written is storable
    (:func:`~outbox.core.text.storable_text`): a handler's error quoting a payload's lone
    surrogate must not make the dead letter itself fail, again after every restart."""
    header_text = json.dumps(
        [
            [
                storable_text(name),
                None if data is None else storable_text(data.decode("utf-8", "replace")),
            ]
            for name, data in headers
        ]
    )
    yield Statement(
        statements.dead_letter_message,
        {
            "consumer": consumer,
            "topic": storable_text(topic),
            "partition": partition,
            "offset": offset,
            "event_id": event_id,
            "key": key,
            "value": value,
            "headers": header_text,
            "reason": storable_text(reason, max_chars=MAX_REASON_CHARS),
            "attempts": attempts,
        },
        Result.ROWCOUNT,
    )


def delete_expired(sql: str, window: timedelta) -> Generator[Statement, Rows, int]:
    """Delete rows older than ``window`` with ``sql``; return how many went."""
    if window <= timedelta(0):
        raise EventError(f"the retention window must be positive, got {window}")
    rows = yield Statement(sql, {"window_seconds": window.total_seconds()}, Result.ROWCOUNT)
    return int(rows[0][0])
