"""The operator's side of the consumers' dead letters: list them, look at one, replay or discard.

:class:`~outbox.consumer.IdempotentConsumer` keeps a record it could not handle in
``outbox.outbox_inbox_dead_letter``, by its place (consumer, topic, partition, offset), with
its raw key and value, its headers as text, the reason and the attempts. ``outbox consumer
dead-letters`` is the command line for these functions:

- :func:`list_dead_letters` and :func:`get_dead_letter` read them;
- :func:`replay_dead_letter` (with a :class:`Replayer`) produces the stored record again to
  its topic (same key, value and headers) with an idempotent producer, ``acks=all``, and
  deletes the dead letter in a transaction that commits only once the broker acknowledged
  the copy: if the send fails, times out or the process dies, the transaction rolls back and
  the dead letter stays. (The command can end with the copy on Kafka and the dead letter
  still there, if the commit itself fails: a second replay makes a second copy, which every
  consumer that handled the first skips through its inbox.) Consumers that already handled
  the event skip the copy the same way, its content digest being the original's, as long as
  they keep its claim (``OUTBOX_INBOX_RETENTION``, 7 days by default). The copy is
  written after everything on its partition: it comes **after the newer events of its
  aggregate**;
- :func:`discard_dead_letters` deletes them for good.

A dead letter is replayed only when its stored record is the one Kafka delivered
(:func:`replay_refusal`): its headers are kept as text, and where the record's bytes were
not text (a header value that is not UTF-8 or holds NUL, a header name that is not UTF-8,
escaped ``\\xff`` in a record without event id) what was kept is not what was sent. Such a
dead letter is refused with the reason; discard it (its content is in ``show``). So is a
conflicting copy (other content under an event id the consumer handled first): replayed,
it would be set aside again.

Row-level security (outbox_0005) shows a consumer role only the dead letters of its
registered consumer names: to it, another service's dead letters do not exist. Reading
and discarding take a sync transaction like :class:`~outbox.Inbox` (the caller commits); a
replay takes ``begin`` (``engine.begin``) and opens one transaction per dead letter.
Replaying needs ``kafka-python`` (``pip install 'outbox-relay[relay]'``), imported when a
:class:`Replayer` opens its producer.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Generator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from outbox._drivers import drive, sync_executor
from outbox.core.errors import OutboxError
from outbox.core.protocol import Rows, conflict_reason
from outbox.core.statements import Result, Statement
from outbox.core.text import REPLACEMENT
from outbox.settings import KafkaSettings, OutboxSettings, kafka_settings

__all__ = [
    "ConsumerDeadLetter",
    "DeadLetterNotReplayable",
    "DeadLetterPlace",
    "DeadLetterSummary",
    "Replayed",
    "Replayer",
    "discard_dead_letters",
    "get_dead_letter",
    "list_dead_letters",
    "refusal_to_replay",
    "replay_dead_letter",
    "replay_refusal",
]

Header = tuple[str, str | None]
"""A header as the dead letter keeps it: its name, and its value as text (``None``: null)."""


class DeadLetterNotReplayable(OutboxError):
    """The dead letter's stored record is not the one Kafka delivered (see
    :func:`replay_refusal`): replaying it would publish other bytes. Discard it instead."""


@dataclass(frozen=True, slots=True, order=True)
class DeadLetterPlace:
    """Which dead letter: the consumer's name and the record's place on Kafka."""

    consumer: str
    topic: str
    partition: int
    offset: int

    @property
    def record(self) -> str:
        """``topic[partition]@offset``, the way our messages name a record."""
        return f"{self.topic}[{self.partition}]@{self.offset}"

    def __str__(self) -> str:
        return f"{self.consumer} {self.record}"


@dataclass(frozen=True, slots=True)
class DeadLetterSummary:
    """A dead letter without its key and value bytes (their sizes instead): what ``list``
    prints, and what a replay is judged on before anything is sent."""

    place: DeadLetterPlace
    event_id: str | None
    """The event id; ``None`` for a record that was no outbox event (it could not be decoded)."""
    headers: tuple[Header, ...]
    reason: str
    attempts: int
    failed_at: datetime
    key_bytes: int | None
    """The key's size; ``None``: the record had no key."""
    value_bytes: int | None
    """The value's size; ``None``: the record had no value."""

    def replay_refusal(self) -> str | None:
        """Why the record cannot be produced again as Kafka delivered it; ``None``: it can."""
        return replay_refusal(
            self.event_id,
            self.headers,
            self.key_bytes is None,
            self.value_bytes is None,
            self.reason,
        )


@dataclass(frozen=True, slots=True)
class ConsumerDeadLetter:
    """One dead letter, whole."""

    place: DeadLetterPlace
    event_id: str | None
    key: bytes | None
    value: bytes | None
    headers: tuple[Header, ...]
    """In the record's order, as kept: the values decoded as UTF-8 (see :func:`replay_refusal`)."""
    reason: str
    attempts: int
    failed_at: datetime

    def replay_refusal(self) -> str | None:
        """Why the record cannot be produced again as Kafka delivered it; ``None``: it can."""
        return replay_refusal(
            self.event_id, self.headers, self.key is None, self.value is None, self.reason
        )


@dataclass(frozen=True, slots=True)
class Replayed:
    """Where the broker acknowledged a replayed copy."""

    place: DeadLetterPlace
    """The dead letter it was (deleted now)."""
    topic: str
    partition: int
    offset: int

    @property
    def record(self) -> str:
        return f"{self.topic}[{self.partition}]@{self.offset}"


def replay_refusal(
    event_id: str | None,
    headers: Sequence[Header],
    key_is_null: bool,
    value_is_null: bool,
    reason: str = "",
) -> str | None:
    """Why a dead letter's record cannot be produced again byte for byte; ``None`` when it can.

    Its key and value are kept as bytes, its headers as text. The consumer kept each header
    value decoded as UTF-8 with U+FFFD for bytes that were not (and for NUL, which PostgreSQL
    cannot store), and a header name that is not UTF-8 escaped (``\\xff``: the record then
    has no event id, it could not be decoded). Where that happened the original bytes are
    gone: replaying would publish a record no consumer has seen, under whatever event id it
    carries. U+FFFD in a header is taken as such a loss (a header that really held U+FFFD is
    refused too). kafka-python cannot send a header without a value, nor a record with
    neither key nor value. A conflicting copy (its ``reason`` says so: other content under an
    event id the consumer handled) is refused as well: the consumer sets it aside again, and
    every other consumer of the topic would get the reused or forged copy once more."""
    if event_id is not None and reason == conflict_reason(event_id):
        return (
            f"it is a copy with other content under event id {event_id}, which this consumer "
            "handled first (the id was reused or forged): replayed, it would be set aside "
            "again, and reach every other consumer of the topic once more; discard it once "
            "you know who wrote it"
        )
    for name, value in headers:
        if REPLACEMENT in name or (value is not None and REPLACEMENT in value):
            return (
                f"its header {name!r} was not kept as it was sent (bytes that are not UTF-8, "
                "or NUL, were kept as U+FFFD): the record cannot be produced again as it was "
                "delivered; discard it"
            )
        if event_id is None and "\\" in name:
            return (
                f"its header name {name!r} holds bytes escaped when it was kept (the record "
                "could not be decoded: a header name that is not UTF-8): the record cannot be "
                "produced again as it was delivered; discard it"
            )
        if value is None:
            return (
                f"its header {name!r} has no value (null), which kafka-python cannot send: "
                "discard it, or produce it again with another client"
            )
    if key_is_null and value_is_null:
        return (
            "the record has neither key nor value, which kafka-python cannot send: discard it, "
            "or produce it again with another client"
        )
    return None


def refusal_to_replay(
    letter: DeadLetterSummary | ConsumerDeadLetter,
    settings: OutboxSettings,
    *,
    past_inbox_retention: bool = False,
    now: datetime | None = None,
) -> str | None:
    """Why ``letter`` is not replayed now; ``None``: replay it. Its record is not the one
    delivered (:func:`replay_refusal`), or (unless ``past_inbox_retention``) it is older than
    the inbox keeps its claims (``OUTBOX_INBOX_RETENTION``): consumers that handled the event
    may have forgotten it, and would handle the copy again."""
    refusal = letter.replay_refusal()
    if refusal is not None or past_inbox_retention:
        return refusal
    age = (now or datetime.now(UTC)) - letter.failed_at
    if age <= settings.inbox_retention:
        return None
    return (
        f"dead-lettered {age.total_seconds() / 86400:.1f} days ago, longer than the inbox "
        f"keeps its claims (OUTBOX_INBOX_RETENTION: "
        f"{settings.inbox_retention.total_seconds() / 86400:g} days): consumers that handled "
        "the event may have forgotten it, and would handle the copy again. Check them, then "
        "replay with --past-inbox-retention; or discard it"
    )


# -- reading and discarding -------------------------------------------------------------------

_PLACE = 'consumer, topic, partition, "offset"'
_BY_PLACE = (
    'consumer = %(consumer)s AND topic = %(topic)s AND partition = %(partition)s AND "offset" = '
    "%(offset)s"
)
_WHOLE = f"{_PLACE}, event_id, key, value, headers, reason, attempts, failed_at"


class _Statements:
    """The SQL of this module, for one configuration's table (a validated, quoted name)."""

    def __init__(self, settings: OutboxSettings | None) -> None:
        table = (settings if settings is not None else OutboxSettings()).tables
        self.table = table.qualified_inbox_dead_letter

    @property
    def listing(self) -> str:
        return (
            f"SELECT {_PLACE}, event_id, headers, reason, attempts, failed_at, "
            f"octet_length(key), octet_length(value)\nFROM {self.table}\n"
            "WHERE CAST(%(consumer)s AS text) IS NULL OR consumer = %(consumer)s\n"
            'ORDER BY failed_at, consumer, topic, partition, "offset"\n'
            "LIMIT CAST(%(limit)s AS bigint)"
        )

    @property
    def get(self) -> str:
        return f"SELECT {_WHOLE}\nFROM {self.table}\nWHERE {_BY_PLACE}"

    @property
    def discard_all(self) -> str:
        return (
            f"DELETE FROM {self.table} WHERE consumer = %(consumer)s "  # noqa: S608
            f"RETURNING {_PLACE}"
        )

    @property
    def discard(self) -> str:
        return f"DELETE FROM {self.table} WHERE {_BY_PLACE} RETURNING {_PLACE}"  # noqa: S608

    @property
    def take(self) -> str:
        """Delete one, returning it whole (a replay: committed once the copy is on Kafka)."""
        return f"DELETE FROM {self.table} WHERE {_BY_PLACE} RETURNING {_WHOLE}"  # noqa: S608


def _rows(sql: str, params: dict[str, Any]) -> Generator[Statement, Rows, Rows]:
    rows = yield Statement(sql, params, Result.ROWS)
    return rows


def _run(transaction: object, sql: str, params: dict[str, Any]) -> Rows:
    return drive(_rows(sql, params), sync_executor(transaction))


def _place_params(place: DeadLetterPlace) -> dict[str, Any]:
    return {
        "consumer": place.consumer,
        "topic": place.topic,
        "partition": place.partition,
        "offset": place.offset,
    }


def _headers(stored: Any) -> tuple[Header, ...]:
    """The ``headers`` column ([[name, value or null], ...]) as tuples."""
    pairs = json.loads(stored) if isinstance(stored, str | bytes) else stored
    return tuple((str(name), None if value is None else str(value)) for name, value in pairs)


def _bytes(value: Any) -> bytes | None:
    return None if value is None else bytes(value)


def _whole(row: Sequence[Any]) -> ConsumerDeadLetter:
    consumer, topic, partition, offset, event_id, key, value, headers, *rest = row
    reason, attempts, failed_at = rest
    return ConsumerDeadLetter(
        DeadLetterPlace(consumer, topic, int(partition), int(offset)),
        event_id,
        _bytes(key),
        _bytes(value),
        _headers(headers),
        reason,
        int(attempts),
        failed_at,
    )


def list_dead_letters(
    transaction: object,
    *,
    consumer: str | None = None,
    limit: int | None = 100,
    settings: OutboxSettings | None = None,
) -> list[DeadLetterSummary]:
    """Dead letters, oldest first (of one consumer, or of every consumer the role may see);
    ``limit=None``: all of them."""
    sql = _Statements(settings).listing
    rows = _run(transaction, sql, {"consumer": consumer, "limit": limit})
    return [
        DeadLetterSummary(
            DeadLetterPlace(name, topic, int(partition), int(offset)),
            event_id,
            _headers(headers),
            reason,
            int(attempts),
            failed_at,
            key_bytes,
            value_bytes,
        )
        for (
            name,
            topic,
            partition,
            offset,
            event_id,
            headers,
            reason,
            attempts,
            failed_at,
            key_bytes,
            value_bytes,
        ) in rows
    ]


def get_dead_letter(
    transaction: object, place: DeadLetterPlace, *, settings: OutboxSettings | None = None
) -> ConsumerDeadLetter | None:
    """The dead letter at ``place``, whole; ``None`` when there is none (for this role)."""
    rows = _run(transaction, _Statements(settings).get, _place_params(place))
    return _whole(rows[0]) if rows else None


def discard_dead_letters(
    transaction: object,
    consumer: str,
    places: Sequence[DeadLetterPlace] | None = None,
    *,
    settings: OutboxSettings | None = None,
) -> list[DeadLetterPlace]:
    """Delete these dead letters of ``consumer`` for good (``None``: all of them); the places
    that were there. The consumer never handles their records."""
    statements = _Statements(settings)
    if places is None:
        rows = _run(transaction, statements.discard_all, {"consumer": consumer})
    else:
        wrong = [str(place) for place in places if place.consumer != consumer]
        if wrong:
            raise ValueError(f"not dead letters of consumer {consumer!r}: {', '.join(wrong)}")
        rows = []
        for place in places:
            rows += _run(transaction, statements.discard, _place_params(place))
    return sorted(DeadLetterPlace(c, t, int(p), int(o)) for c, t, p, o in rows)


# -- replaying ----------------------------------------------------------------------------------

_MAX_REQUEST_BYTES = 100 * 2**20
"""The producer's own limit on a record: the record came from this cluster, so the broker's
limit (``message.max.bytes``, the topic's ``max.message.bytes``) is the one that decides."""


class Replayer:
    """An idempotent producer (``acks=all``) for replaying dead letters; close it after."""

    def __init__(
        self,
        kafka: KafkaSettings | str,
        *,
        delivery_timeout_seconds: float = 30.0,
        client_id: str = "outbox-dead-letter-replay",
    ) -> None:
        """``kafka``: the cluster and how to reach it (servers and security); a refused login
        raises :class:`~outbox.core.errors.BrokerAuthenticationError` within seconds."""
        from kafka import KafkaProducer

        from outbox.kafka_clients import open_client
        from outbox.kafka_options import client_options

        self._kafka = kafka_settings(kafka)
        self.delivery_timeout_seconds = delivery_timeout_seconds
        delivery_ms = int(delivery_timeout_seconds * 1000)
        options = dict(
            client_options(self._kafka, client_id=client_id),
            metrics_enabled=False,  # its per-topic names collide for a.b and a_b
            acks="all",
            enable_idempotence=True,
            linger_ms=0,
            max_request_size=_MAX_REQUEST_BYTES,
            delivery_timeout_ms=delivery_ms,
            request_timeout_ms=max(1000, min(10_000, delivery_ms - 1000)),
            max_block_ms=delivery_ms,
            retry_backoff_ms=100,
        )
        self._producer: Any = open_client(self._kafka, KafkaProducer, options)

    def send(self, letter: ConsumerDeadLetter) -> Replayed:
        """Produce the letter's record again and wait for the broker's acknowledgement (at
        most the delivery timeout); the broker's refusal or silence raises our
        :class:`~outbox.core.errors.BrokerError` (or a subclass). Keyed records go where
        their key goes (as every record of the aggregate); a record without key to the
        partition it was read from."""
        from outbox.kafka_clients import kafka_errors

        refusal = letter.replay_refusal()
        if refusal is not None:
            raise DeadLetterNotReplayable(f"dead letter {letter.place} not replayed: {refusal}")
        headers = [(name, (value or "").encode()) for name, value in letter.headers]
        with kafka_errors(self._kafka):
            future = self._producer.send(
                letter.place.topic,
                key=letter.key,
                value=letter.value,
                headers=headers,
                partition=letter.place.partition if letter.key is None else None,
            )
            metadata = future.get(timeout=self.delivery_timeout_seconds)
        return Replayed(letter.place, metadata.topic, metadata.partition, metadata.offset)

    def close(self) -> None:
        """Close without waiting: every send was awaited, or has failed."""
        from kafka.errors import KafkaError

        with contextlib.suppress(KafkaError):
            self._producer.close(timeout=0)


def replay_dead_letter(
    begin: Callable[[], AbstractContextManager[Any]],
    replayer: Replayer,
    place: DeadLetterPlace,
    *,
    settings: OutboxSettings | None = None,
) -> Replayed | None:
    """Replay one dead letter: in one transaction of ``begin``, delete it, produce its record
    again and wait for the acknowledgement; the transaction commits only then. ``None`` when
    there is no such dead letter (for this role), or it went meanwhile.

    Raises :class:`DeadLetterNotReplayable` when the stored record is not the one delivered,
    and our :class:`~outbox.core.errors.BrokerError` (or a subclass) when the broker refused
    or did not answer: either way the transaction rolls back and the dead letter stays.
    (The delete comes first so that two replays of one dead letter at once send one copy:
    the second waits on the first's row lock, then finds nothing.)"""
    take = _Statements(settings).take
    with begin() as transaction:
        rows = _run(transaction, take, _place_params(place))
        if not rows:
            return None
        return replayer.send(_whole(rows[0]))
