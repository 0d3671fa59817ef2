"""A record as our readers get it from Kafka, whatever its bytes, and its decoding. (Pure.)

Every reader of the project (the relay's CDC watch, ``IdempotentConsumer``, reconcile, trace,
the chaos suite, the demo) receives :class:`KafkaRecord` objects from one reading layer
(:mod:`outbox.kafka_reading`) and decodes them here. Two promises:

- **every record comes through.** A record Kafka holds but no reader of ours can take at its
  word (today: a header name that is not UTF-8, which Apache Kafka accepts from any Go, C or
  Java producer) still arrives, in its place, with ``unreadable`` saying why; nothing stops
  at it;
- **decoding never raises.** :func:`decode_event` returns the event, or an
  :class:`Undecodable` naming the topic, partition, offset and reason: the caller
  dead-letters, quarantines or reports it, and goes on.

:func:`content_digest` says whether two copies of one event id say the same thing
(reconcile's findings, ``IdempotentConsumer``'s inbox claims).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

from outbox.core.contract import ReceivedEvent, parse_record
from outbox.core.errors import ContractViolation

__all__ = ["KafkaRecord", "Undecodable", "content_digest", "decode_event", "undecodable"]


@dataclass(frozen=True, slots=True)
class KafkaRecord:
    """One record read from Kafka: its place, its timestamp and its bytes."""

    topic: str
    partition: int
    offset: int
    timestamp_ms: int
    key: bytes | None
    value: bytes | None
    headers: Sequence[tuple[str, bytes | None]]
    """In the record's order. A header name that is not UTF-8 appears with its bad bytes
    escaped (``\\xff``), and ``unreadable`` says so: never take such a record at its word."""
    unreadable: str | None = None
    """Why the record cannot be read as it was written, or ``None``."""

    @property
    def place(self) -> str:
        """``topic[partition]@offset``, the way our messages name a record."""
        return f"{self.topic}[{self.partition}]@{self.offset}"


@dataclass(frozen=True, slots=True)
class Undecodable:
    """A record that is not an outbox event as the contract says (docs/contract.md): where it
    is, and why."""

    topic: str
    partition: int
    offset: int
    reason: str

    @property
    def place(self) -> str:
        return f"{self.topic}[{self.partition}]@{self.offset}"


def undecodable(record: KafkaRecord) -> Undecodable | None:
    """The record as :class:`Undecodable` when no reader may take it at its word, else
    ``None`` (its contract may still be broken: see :func:`decode_event`)."""
    if record.unreadable is None:
        return None
    return Undecodable(record.topic, record.partition, record.offset, record.unreadable)


def decode_event(record: KafkaRecord) -> ReceivedEvent | Undecodable:
    """The outbox event a record carries, or why it carries none. Never raises."""
    unread = undecodable(record)
    if unread is not None:
        return unread
    try:
        return parse_record(
            topic=record.topic,
            partition=record.partition,
            offset=record.offset,
            key=record.key,
            value=record.value,
            headers=record.headers,
        )
    except ContractViolation as violation:
        return Undecodable(record.topic, record.partition, record.offset, str(violation))


def content_digest(
    key: bytes | None, value: bytes | None, headers: Sequence[tuple[str, bytes | None]]
) -> str:
    """A digest of what a record says (both delivery paths write an event's record byte for
    byte alike: docs/contract.md), not of where it was read: its key, value and headers,
    names and values in their order. Two copies of one event id are duplicates only when
    their digests are equal. 24 hexadecimal digits (BLAKE2b, 96 bits).

    Inbox claims keep it (outbox_0009) for as long as their retention: a new way of
    computing it would make every copy of an event claimed before look like a conflict."""
    digest = hashlib.blake2b(digest_size=12)
    for part in (
        key,
        value,
        *(item for name, header in headers for item in (name.encode(), header)),
    ):
        digest.update(b"-" if part is None else len(part).to_bytes(4, "big") + part)
    return digest.hexdigest()
