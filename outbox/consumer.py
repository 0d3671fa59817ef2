"""An idempotent Kafka consumer of outbox topics: each event applied exactly once.

For each record: one database transaction claims the event id in the inbox and runs your
handler; both commit or neither does. Kafka offsets are committed after that, so a crash
in between redelivers records whose claims already exist: they are skipped. A handler that
keeps failing on one record (``max_attempts``) sends it to the consumer's dead-letter table
(``outbox.outbox_inbox_dead_letter``) instead of blocking its partition; a record that does
not follow the contract goes there at once, and so does a record no reader can take at
its word (a header name that is not UTF-8: Kafka accepts one from any Go or C producer),
with its offsets and the reason: nothing stops the partition. Database outages (the
connection is lost or refused, the server shuts down) are not the handler's fault: they are
retried without end (with backoff) and never dead-letter anything. Every other database
error, transient or not (a cancelled query, a statement timeout, a serialization failure, a
deadlock), counts as a failed attempt: retried up to ``max_attempts``, then a dead letter,
so that no record can block its partition for ever.

Each claim keeps the digest of the record's key, value and headers
(:func:`~outbox.core.kafka_record.content_digest`): a copy whose event id was handled first
with other content (an id reused or forged) is no duplicate. It is dead-lettered at once,
with a reason naming the id, and never reaches the handler (claims from before outbox_0009
have no digest: a copy of theirs counts as a duplicate). The inbox needs outbox_0009: on an
older one the consumer stops with a ``ConfigurationError`` at the first record.

    from sqlalchemy.orm import sessionmaker
    from outbox.consumer import IdempotentConsumer

    def apply(session, event):                      # your side effects, in the transaction
        session.add(Shipment(order_id=event.aggregate_id))

    consumer = IdempotentConsumer(
        name="shipping", topics=["outbox.event.order"], group_id="shipping",
        bootstrap_servers="kafka:9092", begin=sessionmaker(engine).begin, handler=apply,
    )
    consumer.run(stop)                              # until stop (a threading.Event) is set

Needs ``kafka-python`` (``pip install 'outbox-relay[relay]'``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from outbox._drivers import drive, sync_executor
from outbox.core.contract import ReceivedEvent
from outbox.core.errors import ConfigurationError
from outbox.core.kafka_record import KafkaRecord, Undecodable, content_digest, decode_event
from outbox.core.protocol import Claim, claim_message, conflict_reason, dead_letter_message
from outbox.core.statements import OutboxStatements
from outbox.core.text import storable_text
from outbox.kafka_reading import KafkaReader, ReaderRole
from outbox.settings import KafkaSettings, OutboxSettings, kafka_settings
from outbox.tracing import Processing, processing

__all__ = ["ConsumerStats", "IdempotentConsumer", "ReceivedEvent"]

log = logging.getLogger("outbox.consumer")

T = TypeVar("T")


# SQLSTATEs of a lost or refused connection: class 08, and the server shutting down or
# starting (57P01 admin_shutdown, 57P02 crash_shutdown, 57P03 cannot_connect_now).
_OUTAGE_STATES = ("08", "57P01", "57P02", "57P03")


def _is_database_outage(error: BaseException) -> bool:
    """Connection-level database failures (retry without end, not the handler's fault).

    Not an outage: ``QueryCanceled`` (57014, a statement timeout), serialization failures
    and deadlocks (class 40): psycopg files them under ``OperationalError`` too, but they
    can repeat for ever for one record, so they count as failed attempts.
    """
    import psycopg
    from sqlalchemy import exc

    if isinstance(error, exc.DBAPIError):
        if error.connection_invalidated:
            return True
        if error.orig is None:
            return isinstance(error, exc.OperationalError | exc.InterfaceError)
        error = error.orig
    if isinstance(error, psycopg.InterfaceError):
        return True  # the connection is closed or broken: no server error at all
    if isinstance(error, psycopg.OperationalError):
        state = error.sqlstate
        return state is None or state.startswith(_OUTAGE_STATES)
    return False


class _InboxNotMigrated(ConfigurationError):
    """The inbox has no ``digest`` column: the database is older than outbox_0009."""


def _not_migrated(error: Exception) -> _InboxNotMigrated | None:
    """A claim that failed because the inbox has no ``digest`` column (42703
    undefined_column: the one column newer than outbox_0001 a claim names). The run stops,
    rather than every record failing its attempts and being dead-lettered."""
    cause = getattr(error, "orig", None) or error
    if getattr(cause, "sqlstate", None) != "42703":
        return None
    return _InboxNotMigrated(
        f"the inbox cannot keep the claims' digests ({str(cause).strip()}): migrate the "
        "database to outbox_0009 or later (`outbox db upgrade`) before running this consumer"
    )


def _raise_if_refused(error: Exception) -> None:
    """A connection refused for good (TLS: an untrusted certificate, a host name not in it)
    is no outage: retrying cannot cure it, and a record must not be dead-lettered for it.
    Raise our :class:`~outbox.core.errors.DatabaseTlsError` from it; the run stops."""
    from outbox.database_errors import database_error

    refused = database_error(error)
    if refused is not None:
        raise refused from error


@dataclass
class ConsumerStats:
    applied: int = 0
    duplicates: int = 0
    dead_lettered: int = 0
    handler_failures: int = 0


class IdempotentConsumer(Generic[T]):
    """Consume outbox topics and apply each event exactly once to your database.

    ``begin`` opens a transaction and yields what ``handler`` gets: ``engine.begin`` (a
    SQLAlchemy ``Connection``), ``sessionmaker(engine).begin`` (a ``Session``), or for psycopg
    a function returning ``connection.transaction()``-style context managers that yield the
    connection. ``name`` is the inbox's consumer name: one per service, stable across
    deploys. Subscribe with ``topics`` or a regex ``pattern`` (e.g. ``^outbox\\.event\\..*``).
    ``consumer_options``: the reader's group timing and fetch sizes by name
    (``session_timeout_ms``, ``max_poll_records``...: :class:`outbox.kafka_reading.ReaderRole`).
    It reads committed records only, as every reader of the project.

    The cluster: ``kafka`` (:class:`~outbox.settings.KafkaSettings`: servers and security,
    e.g. ``KafkaSettings()`` from ``OUTBOX_KAFKA_*``), or ``bootstrap_servers`` alone for a
    cluster without security; neither: ``KafkaSettings()``. A refused login raises
    :class:`~outbox.BrokerAuthenticationError` within seconds, a group or topic outside the
    principal's ACLs :class:`~outbox.BrokerAuthorizationError`.
    """

    def __init__(
        self,
        *,
        name: str,
        group_id: str,
        bootstrap_servers: str | None = None,
        kafka: KafkaSettings | None = None,
        begin: Callable[[], AbstractContextManager[T]],
        handler: Callable[[T, ReceivedEvent], None],
        topics: Sequence[str] = (),
        pattern: str | None = None,
        max_attempts: int = 5,
        retry_backoff_seconds: float = 0.2,
        settings: OutboxSettings | None = None,
        consumer_options: dict[str, Any] | None = None,
    ) -> None:
        if bootstrap_servers is not None and kafka is not None:
            raise ConfigurationError("give kafka=KafkaSettings(...) or bootstrap_servers, not both")
        if bool(topics) == (pattern is not None):
            raise ConfigurationError("give topics=[...] or pattern='...', one of the two")
        if max_attempts < 1:
            raise ConfigurationError(f"max_attempts={max_attempts} must be at least 1")
        self.name = name
        self._group = group_id
        self.stats = ConsumerStats()
        self._begin = begin
        self._handler = handler
        self._max_attempts = max_attempts
        self._backoff = retry_backoff_seconds
        self._statements = OutboxStatements((settings or OutboxSettings()).tables)
        role = ReaderRole(client_id=f"outbox-consumer-{name}", group_id=group_id)
        if kafka is None:
            kafka = (
                KafkaSettings() if bootstrap_servers is None else kafka_settings(bootstrap_servers)
            )
        self._reader = KafkaReader(kafka, role.with_options(consumer_options))
        self._reader.subscribe(topics, pattern)

    def run(self, stop: threading.Event) -> None:
        """Consume until ``stop`` is set; the record in hand is finished first."""
        try:
            while not stop.is_set():
                self.poll_once(timeout_seconds=0.5, stop=stop)
        except _Stopped:
            return  # the record in hand is not committed: it comes again after a restart
        finally:
            self._reader.close()

    def poll_once(self, *, timeout_seconds: float, stop: threading.Event | None = None) -> int:
        """Handle one poll's records, then commit their offsets. How many records came."""
        records = self._reader.poll(timeout_seconds)
        for record in records:
            self._handle(record, stop)
        if records:
            self._reader.commit()
        return len(records)

    def close(self) -> None:
        self._reader.close()

    # -- one record ------------------------------------------------------------------------

    def _handle(self, record: KafkaRecord, stop: threading.Event | None) -> None:
        # _Stopped leaves the record for after a restart: no failure on its span
        with processing(record, consumer=self.name, group=self._group, stops=(_Stopped,)) as span:
            event = decode_event(record)
            if isinstance(event, Undecodable):
                self._dead_letter(record, None, f"not an outbox record: {event.reason}", 1, stop)
                span.outcome("dead-lettered")
                return
            outcome = self._handle_event(record, event, stop, span)
            span.outcome(outcome, event_id=str(event.event_id))

    def _handle_event(
        self,
        record: KafkaRecord,
        event: ReceivedEvent,
        stop: threading.Event | None,
        span: Processing,
    ) -> str:
        """Apply ``event`` once (or dead-letter it); the outcome (:data:`CONSUMER_OUTCOMES`)."""
        digest = content_digest(record.key, record.value, record.headers)
        attempts = 0
        backoff = self._backoff
        while True:
            span.attempt()  # the outcome is the committed attempt's, not a failed one's
            try:
                with self._begin() as transaction:
                    claimed = self._claim(transaction, event, digest)
                    if claimed is Claim.NEW:
                        self._handler(transaction, event)
                break
            except _InboxNotMigrated:
                raise
            except Exception as error:
                _raise_if_refused(error)
                if _is_database_outage(error):
                    log.warning("database unavailable, retrying: %s", type(error).__name__)
                else:
                    attempts += 1
                    self.stats.handler_failures += 1
                    # Storable is printable too: a lone surrogate has no UTF-8 encoding.
                    reason = storable_text(f"{type(error).__name__}: {error}")
                    log.warning(
                        "handler failed on event %s (attempt %d of %d): %s",
                        event.event_id,
                        attempts,
                        self._max_attempts,
                        reason,
                    )
                    if attempts >= self._max_attempts:
                        self._dead_letter(record, event, reason, attempts, stop)
                        return "dead-lettered"
            _pause(backoff, stop)
            backoff = min(backoff * 2, 5.0)
        if claimed is Claim.NEW:
            self.stats.applied += 1
            return "handled"
        if claimed is Claim.DUPLICATE:
            self.stats.duplicates += 1
            return "duplicate"
        # nothing was written: the claim found is another copy's
        self._dead_letter(record, event, conflict_reason(event.event_id), 1, stop)
        return "dead-lettered"

    def _claim(self, transaction: T, event: ReceivedEvent, digest: str) -> Claim:
        try:
            return drive(
                claim_message(self._statements, event.event_id, self.name, digest),
                sync_executor(transaction),
            )
        except Exception as error:
            not_migrated = _not_migrated(error)
            if not_migrated is not None:
                raise not_migrated from error
            raise

    def _dead_letter(
        self,
        record: KafkaRecord,
        event: ReceivedEvent | None,
        reason: str,
        attempts: int,
        stop: threading.Event | None,
    ) -> None:
        backoff = self._backoff
        while True:
            try:
                with self._begin() as transaction:
                    drive(
                        dead_letter_message(
                            self._statements,
                            consumer=self.name,
                            topic=record.topic,
                            partition=record.partition,
                            offset=record.offset,
                            event_id=None if event is None else str(event.event_id),
                            key=record.key,
                            value=record.value,
                            headers=record.headers,
                            reason=reason,
                            attempts=attempts,
                        ),
                        sync_executor(transaction),
                    )
                self.stats.dead_lettered += 1
                log.error(
                    "record %s/%d@%d sent to the dead letters: %s",
                    record.topic,
                    record.partition,
                    record.offset,
                    storable_text(reason),
                )
                return
            except Exception as error:
                _raise_if_refused(error)
                if not _is_database_outage(error):
                    raise
                _pause(backoff, stop)
                backoff = min(backoff * 2, 5.0)


class _Stopped(Exception):
    """Stop was requested while waiting to retry: leave without committing the offset."""


def _pause(seconds: float, stop: threading.Event | None) -> None:
    """Wait before a retry; with a stop event, end the wait (and the run) when it is set."""
    if stop is None:
        time.sleep(seconds)
    elif stop.wait(seconds):
        raise _Stopped
