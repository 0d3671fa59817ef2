"""The event contract on Kafka, written down once; every delivery path produces exactly this.

A record for an outbox row:

- topic ``outbox.event.<aggregatetype>`` (Debezium's default routing);
- key: ``aggregateid``, UTF-8;
- value: the payload as PostgreSQL writes its ``jsonb`` as text (``payload::text``), UTF-8 -
  plain JSON, not a Debezium envelope;
- headers, in this order: ``id`` (the event id, canonical UUID text), ``eventType``,
  ``traceparent`` (W3C trace context; an empty value when the event has none),
  ``headers`` (the event's extra headers as a JSON object, ``{}`` when none),
  ``position`` (the outbox row's ``position`` in decimal ASCII: commit order within an
  aggregate, the order the lake keeps).

A consumer cannot tell which path (CDC or the polling relay) delivered a record. Duplicates
across paths or after a crash carry the same ``id``: consumers deduplicate on it.
See docs/contract.md.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from outbox.core.errors import ContractViolation

__all__ = [
    "HEADER_EVENT_TYPE",
    "HEADER_HEADERS",
    "HEADER_ID",
    "HEADER_POSITION",
    "HEADER_TRACEPARENT",
    "TOPIC_PREFIX",
    "ContractRecord",
    "ContractViolation",
    "ReceivedEvent",
    "event_id_of",
    "headers_for",
    "load_strict_json",
    "parse_record",
    "record_for",
    "refuse_json_constant",
    "topic_for",
]

TOPIC_PREFIX = "outbox.event."
HEADER_ID = "id"
HEADER_EVENT_TYPE = "eventType"
HEADER_TRACEPARENT = "traceparent"
HEADER_HEADERS = "headers"
HEADER_POSITION = "position"

Headers = tuple[tuple[str, bytes], ...]


@dataclass(frozen=True, slots=True)
class ContractRecord:
    topic: str
    key: bytes
    value: bytes
    headers: Headers


def topic_for(aggregate_type: str) -> str:
    return TOPIC_PREFIX + aggregate_type


def record_for(
    *,
    event_id: uuid.UUID,
    aggregate_type: str,
    aggregate_id: str,
    event_type: str,
    payload_text: str,
    headers_text: str,
    traceparent: str | None,
    position: int,
) -> ContractRecord:
    """The record for one outbox row, its jsonb columns given as PostgreSQL's text.

    The table stores ``''`` for "no traceparent" (migration outbox_0003); ``None`` is taken
    as the same.
    """
    return ContractRecord(
        topic=topic_for(aggregate_type),
        key=aggregate_id.encode(),
        value=payload_text.encode(),
        headers=tuple(
            headers_for(
                event_id=str(event_id).encode(),
                event_type=event_type.encode(),
                traceparent=traceparent.encode() if traceparent else b"",
                headers=headers_text.encode(),
                position=str(position).encode(),
            )
        ),
    )


def headers_for(
    *, event_id: bytes, event_type: bytes, traceparent: bytes, headers: bytes, position: bytes
) -> list[tuple[str, bytes]]:
    """The record's headers from the row's columns as UTF-8 bytes (the relay's fast path)."""
    return [
        (HEADER_ID, event_id),
        (HEADER_EVENT_TYPE, event_type),
        (HEADER_TRACEPARENT, traceparent),
        (HEADER_HEADERS, headers),
        (HEADER_POSITION, position),
    ]


def event_id_of(headers: Sequence[tuple[str, bytes | None]]) -> uuid.UUID:
    """The event id of a received record; :class:`ContractViolation` (a ``ValueError``) when
    it carries none or a malformed one."""
    for name, value in headers:
        if name == HEADER_ID and value is not None:
            try:
                return uuid.UUID(value.decode("ascii"))
            except (UnicodeDecodeError, ValueError):
                raise ContractViolation(
                    f"the 'id' header {value[:80]!r} is not a UUID: it does not follow the "
                    "outbox contract"
                ) from None
    raise ContractViolation("the record has no 'id' header: it does not follow the outbox contract")


def _text(value: bytes, what: str) -> str:
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ContractViolation(
            f"{what} is not UTF-8 ({error.reason} at byte {error.start})"
        ) from None


@dataclass(frozen=True, slots=True)
class ReceivedEvent:
    """An outbox event as a consumer receives it, whichever path delivered it."""

    event_id: uuid.UUID
    aggregate_type: str
    aggregate_id: str
    event_type: str
    payload: Any
    """The value as JSON: numbers with a fraction or an exponent are ``Decimal`` (exact: a
    ``Decimal`` published comes back equal), integers ``int``."""
    headers: dict[str, str]
    traceparent: str | None
    topic: str
    partition: int
    offset: int
    position: int | None = None
    """Commit order within the aggregate; ``None`` for records written before the header."""
    payload_text: str | None = None
    """The value exactly as received (``None`` for a tombstone)."""
    headers_text: str = "{}"
    """The ``headers`` header exactly as received."""


def parse_record(
    *,
    topic: str,
    partition: int,
    offset: int,
    key: bytes | None,
    value: bytes | None,
    headers: Sequence[tuple[str, bytes | None]],
) -> ReceivedEvent:
    """Read a contract record back; :class:`ContractViolation` names what is wrong.

    Whatever the bytes, this raises nothing but :class:`ContractViolation`: a consumer can
    always set a record aside with the reason and go on.
    """
    if not topic.startswith(TOPIC_PREFIX):
        raise ContractViolation(f"topic {topic!r} is not an outbox topic ({TOPIC_PREFIX}<type>)")
    named = {name: data for name, data in headers}
    event_id = event_id_of(headers)
    event_type = named.get(HEADER_EVENT_TYPE)
    if not event_type:
        raise ContractViolation("the record has no 'eventType' header")
    payload_text = _text(value, "the value") if value is not None else None
    headers_text = _text(named.get(HEADER_HEADERS) or b"{}", "the 'headers' header")
    payload = _json(payload_text, "the value", exact=True) if payload_text is not None else None
    extra = _json(headers_text, "the 'headers' header")
    if not isinstance(extra, dict):
        raise ContractViolation("the 'headers' header is not a JSON object")
    traceparent = named.get(HEADER_TRACEPARENT)
    return ReceivedEvent(
        event_id=event_id,
        aggregate_type=topic[len(TOPIC_PREFIX) :],
        aggregate_id=_text(key, "the key") if key is not None else "",
        event_type=_text(event_type, "the 'eventType' header"),
        payload=payload,
        headers={str(k): str(v) for k, v in extra.items()},
        traceparent=_text(traceparent, "the 'traceparent' header") if traceparent else None,
        topic=topic,
        partition=partition,
        offset=offset,
        position=_position(named.get(HEADER_POSITION)),
        payload_text=payload_text,
        headers_text=headers_text,
    )


def refuse_json_constant(name: str) -> Any:
    """``parse_constant`` for ``json.loads``: NaN and Infinity are not JSON."""
    raise ValueError(f"{name} is not JSON")


# One decoder each for the process: json.loads builds a new one on every call given an option.
_STRICT_DECODER = json.JSONDecoder(parse_constant=refuse_json_constant)
_EXACT_DECODER = json.JSONDecoder(parse_constant=refuse_json_constant, parse_float=Decimal)


def load_strict_json(text: str, *, exact: bool = False) -> Any:
    """``json.loads(text, parse_constant=refuse_json_constant)``, without a decoder per call
    (it runs for every record the lake and the consumers read); with ``exact``, numbers with
    a fraction or an exponent are ``Decimal`` (``parse_float=Decimal``), not ``float``."""
    if text.startswith("\ufeff"):  # as json.loads
        raise json.JSONDecodeError("Unexpected UTF-8 BOM (decode using utf-8-sig)", text, 0)
    return (_EXACT_DECODER if exact else _STRICT_DECODER).decode(text)


def _json(text: str, what: str, *, exact: bool = False) -> Any:
    """Strict JSON: ``NaN``/``Infinity`` refused; nesting too deep for Python refused."""
    try:
        return load_strict_json(text, exact=exact)
    except ValueError as error:  # JSONDecodeError is a ValueError
        raise ContractViolation(f"{what} is not JSON: {error}") from None
    except RecursionError:
        raise ContractViolation(f"{what} is JSON nested too deeply to read") from None


def _position(value: bytes | None) -> int | None:
    if value is None:
        return None
    if not (value.isdigit() and len(value) <= 19 and int(value) < 2**63):
        raise ContractViolation(
            f"the 'position' header {value[:40]!r} is not a decimal bigint (0 to 2^63-1)"
        )
    return int(value)
