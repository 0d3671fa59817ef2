"""Which broker answers make a row a dead letter, and which only delay it. (Pure decisions.)

A row becomes a dead letter only when no retry can ever succeed *for that record*: it is too
large, or the broker calls the record itself invalid or corrupt, or its topic name is not a
valid (or a colliding) topic name. Everything else is transient for the row, however the
client library labels it: ``OutOfOrderSequenceNumber``, ``UnknownProducerId`` and
``InvalidProducerEpoch`` (the idempotent producer lost its state: a new producer fixes it),
authorization errors (an ACL not created yet), timeouts, leaders moving. Such a row stays in
the outbox and its aggregate waits (:class:`outbox_relay.parking.Parking`); other aggregates go on.

Dead-lettering a row whose failure was transient would reorder its aggregate: a replay puts
it after newer events of the same aggregate (docs/operations.md, "Dead letters").
"""

from __future__ import annotations

from kafka.errors import (
    CorruptRecordError,
    InvalidRecordError,
    InvalidTopicError,
    KafkaError,
    KafkaTimeoutError,
    MessageSizeTooLargeError,
    RecordListTooLargeError,
)

from outbox.core.text import MAX_REASON_CHARS, storable_text

__all__ = ["is_permanent", "is_unreachable", "reason_for"]

_PERMANENT: tuple[type[KafkaError], ...] = (
    MessageSizeTooLargeError,
    RecordListTooLargeError,
    InvalidRecordError,
    CorruptRecordError,
    InvalidTopicError,
)


def is_permanent(error: BaseException) -> bool:
    """True when retrying this record can never succeed: it becomes a dead letter."""
    return isinstance(error, _PERMANENT)


def is_unreachable(error: BaseException | None) -> bool:
    """True when the failure says nothing about the record: the broker did not answer.

    ``None`` stands for "not acknowledged within the delivery timeout".
    """
    if error is None or isinstance(error, KafkaTimeoutError):
        return True
    return not isinstance(error, KafkaError) or bool(getattr(error, "retriable", False))


def reason_for(error: BaseException | None) -> str:
    """The reason as stored and logged: the error class, then its text (storable: an
    error's text may quote what it was given)."""
    if error is None:
        return "not acknowledged within the delivery timeout"
    return storable_text(f"{type(error).__name__}: {error}", max_chars=MAX_REASON_CHARS)
