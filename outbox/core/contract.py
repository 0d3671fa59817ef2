"""The event contract on Kafka, written down once; every delivery path produces exactly this.

A record for an outbox row:

- topic ``outbox.event.<aggregatetype>`` (Debezium's default routing);
- key: ``aggregateid``, UTF-8;
- value: the payload as PostgreSQL writes its ``jsonb`` as text (``payload::text``), UTF-8 -
  plain JSON, not a Debezium envelope;
- headers, in this order: ``id`` (the event id, canonical UUID text), ``eventType``,
  ``traceparent`` (W3C trace context; an empty value when the event has none),
  ``headers`` (the event's extra headers as a JSON object, ``{}`` when none).

A consumer cannot tell which path (CDC or the polling relay) delivered a record. Duplicates
across paths or after a crash carry the same ``id``: consumers deduplicate on it.
See docs/contract.md.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "HEADER_EVENT_TYPE",
    "HEADER_HEADERS",
    "HEADER_ID",
    "HEADER_TRACEPARENT",
    "TOPIC_PREFIX",
    "ContractRecord",
    "event_id_of",
    "record_for",
    "topic_for",
]

TOPIC_PREFIX = "outbox.event."
HEADER_ID = "id"
HEADER_EVENT_TYPE = "eventType"
HEADER_TRACEPARENT = "traceparent"
HEADER_HEADERS = "headers"

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
) -> ContractRecord:
    """The record for one outbox row, its jsonb columns given as PostgreSQL's text.

    The table stores ``''`` for "no traceparent" (migration outbox_0003); ``None`` is taken
    as the same.
    """
    return ContractRecord(
        topic=topic_for(aggregate_type),
        key=aggregate_id.encode(),
        value=payload_text.encode(),
        headers=(
            (HEADER_ID, str(event_id).encode()),
            (HEADER_EVENT_TYPE, event_type.encode()),
            (HEADER_TRACEPARENT, traceparent.encode() if traceparent else b""),
            (HEADER_HEADERS, headers_text.encode()),
        ),
    )


def event_id_of(headers: Sequence[tuple[str, bytes | None]]) -> uuid.UUID:
    """The event id of a received record; ValueError when it carries none."""
    for name, value in headers:
        if name == HEADER_ID and value is not None:
            return uuid.UUID(value.decode())
    raise ValueError("the record has no 'id' header: it does not follow the outbox contract")
