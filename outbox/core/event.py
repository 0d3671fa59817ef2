"""The event envelope: what an application publishes, validated before it touches the database."""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import uuid_utils.compat as uuid_utils

from outbox.core.errors import EventError

__all__ = ["Event", "PublishResult", "new_event_id"]

# An aggregate type becomes part of a Kafka topic name (``outbox.event.<aggregatetype>``), so it
# is held to Kafka's topic alphabet, with room left for the prefix under Kafka's 249 limit.
_AGGREGATE_TYPE = re.compile(r"[A-Za-z0-9._-]{1,200}", re.ASCII)
MAX_AGGREGATE_ID_LENGTH = 1024
MAX_EVENT_TYPE_LENGTH = 255
MAX_DEDUP_KEY_LENGTH = 512
# W3C Trace Context, version 00: https://www.w3.org/TR/trace-context/#traceparent-header
_TRACEPARENT = re.compile(r"[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}", re.ASCII)
_HEADER_NAME = re.compile(r"[A-Za-z0-9._-]{1,128}", re.ASCII)
_RESERVED_HEADERS = frozenset({"id", "eventType", "traceparent"})


def new_event_id() -> uuid.UUID:
    """A new time-ordered UUID (version 7): ids sort by creation time, millisecond precision."""
    return uuid_utils.uuid7()


@dataclass(frozen=True, slots=True)
class Event:
    """One outbox event.

    ``aggregate_type`` chooses the Kafka topic, ``aggregate_id`` the record key (and so the
    partition: events of one aggregate keep their order), ``event_type`` travels as a header,
    ``payload`` is the record value. ``headers`` are extra string headers; ``traceparent`` is a
    W3C trace context. ``dedup_key`` makes a publish idempotent within the dedup window.
    ``event_id`` must be a UUIDv7 (the default draws one): consumers deduplicate on it and the
    lake dates the event by its time.
    """

    aggregate_type: str
    aggregate_id: str
    event_type: str
    payload: Any
    headers: Mapping[str, str] = field(default_factory=dict)
    traceparent: str | None = None
    dedup_key: str | None = None
    event_id: uuid.UUID = field(default_factory=new_event_id)

    def __post_init__(self) -> None:
        validate_event(self)


def validate_event(event: Event) -> None:
    """Raise :class:`EventError` naming the first invalid field of ``event``."""
    if not isinstance(event.aggregate_type, str) or not _AGGREGATE_TYPE.fullmatch(
        event.aggregate_type
    ):
        raise EventError(
            f"aggregate_type={event.aggregate_type!r} is invalid: it names the Kafka topic, so "
            "use 1 to 200 ASCII letters, digits, '.', '_' or '-' (for example 'order')"
        )
    _check_text_field("aggregate_id", event.aggregate_id, MAX_AGGREGATE_ID_LENGTH)
    _check_text_field("event_type", event.event_type, MAX_EVENT_TYPE_LENGTH)
    if event.dedup_key is not None:
        _check_text_field("dedup_key", event.dedup_key, MAX_DEDUP_KEY_LENGTH)
    if not isinstance(event.event_id, uuid.UUID):
        raise EventError(
            f"event_id must be a uuid.UUID (version 7), got {type(event.event_id).__name__}: "
            "leave it out (a new one is drawn) or pass outbox.new_event_id()"
        )
    if event.event_id.version != 7 or event.event_id.variant != uuid.RFC_4122:
        kind = (
            f"version {event.event_id.version}"
            if event.event_id.variant == uuid.RFC_4122
            else "not an RFC 9562 variant"
        )
        raise EventError(
            f"event_id={event.event_id} is not a UUIDv7 ({kind}): "
            "the lake dates each event by the time in its id, so an id of another version "
            "would land on 1970-01-01. Leave event_id out (a new one is drawn) or pass "
            "outbox.new_event_id()"
        )
    if event.traceparent is not None and (
        not isinstance(event.traceparent, str) or not _TRACEPARENT.fullmatch(event.traceparent)
    ):
        raise EventError(
            f"traceparent={event.traceparent!r} is not a W3C trace context: expected "
            "'00-<32 hex trace id>-<16 hex span id>-<2 hex flags>'"
        )
    if not isinstance(event.headers, Mapping):
        raise EventError(f"headers must be a mapping of str to str, got {event.headers!r}")
    for name, value in event.headers.items():
        if not isinstance(name, str) or not _HEADER_NAME.fullmatch(name):
            raise EventError(
                f"header name {name!r} is invalid: use 1 to 128 ASCII letters, digits, "
                "'.', '_' or '-'"
            )
        if name in _RESERVED_HEADERS:
            raise EventError(
                f"header {name!r} is set by the outbox itself: pass the trace context as "
                "traceparent=..., and do not set 'id' or 'eventType'"
            )
        if not isinstance(value, str) or "\x00" in value or not _is_unicode(value):
            raise EventError(
                f"headers[{name!r}] must be a str without NUL characters or lone surrogates"
            )


def _check_text_field(name: str, value: object, max_length: int) -> None:
    if not isinstance(value, str):
        raise EventError(
            f"{name} must be a str, got {type(value).__name__} {value!r}: pass str({name})"
        )
    if not value or len(value) > max_length or "\x00" in value or not _is_unicode(value):
        raise EventError(
            f"{name}={value!r} is invalid: use a non-empty str of at most {max_length} "
            "characters without NUL or lone surrogates"
        )


def _is_unicode(text: str) -> bool:
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


@dataclass(frozen=True, slots=True)
class PublishResult:
    """What a publish did: ``duplicate`` is true when a live dedup key made it a no-op.

    For a duplicate, ``event_id`` is the id of the event first published under that key.
    """

    event_id: uuid.UUID
    duplicate: bool = False
