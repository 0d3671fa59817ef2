"""The relay's Kafka side: publish a batch of outbox rows as contract records, and say how it went.

kafka-python with ``acks='all'`` and the idempotent producer: within a partition (one
aggregate), records land in send order and a retried send is not written twice. The broker's
answer sorts every row into one of four outcomes (relay/outbox_relay/failures.py decides which):

- acknowledged: the row may be deleted;
- refused for good (too large, invalid or corrupt record, invalid topic name): a dead letter
  with the broker's reason, never retried by itself;
- refused or unanswered for a reason that can pass (authorization, producer state such as
  ``OutOfOrderSequenceNumber``, a partition without leader): the row stays, its aggregate
  waits and is tried again; the other rows of the batch go on;
- nothing acknowledged and the broker unreachable (down, paused): the whole batch is
  published again later.

Duplicates carry the same event id.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from kafka import KafkaProducer
from kafka.errors import KafkaError

from outbox.core.contract import headers_for, topic_for
from outbox.kafka_clients import open_client
from outbox.kafka_options import client_options
from outbox.settings import KafkaSettings, kafka_settings
from outbox_relay.database import OutboxRow
from outbox_relay.failures import is_permanent, is_unreachable, reason_for
from outbox_relay.settings import RelaySettings

__all__ = ["BatchOutcome", "ContractProducer", "PendingBatch", "Retry"]


@dataclass(frozen=True, slots=True)
class Retry:
    """A row neither acknowledged nor refused for good: it stays, its aggregate waits."""

    row: OutboxRow
    reason: str
    error: str
    """The error's class name (a metric label), or ``timeout``."""


@dataclass
class BatchOutcome:
    delivered: list[str] = field(default_factory=list)
    rejected: list[tuple[str, str]] = field(default_factory=list)
    retry: list[Retry] = field(default_factory=list)
    failure: str | None = None
    """Set when nothing was acknowledged and the broker did not answer: retry the batch."""

    @property
    def retry_ids(self) -> set[str]:
        return {retry.row.id for retry in self.retry}

    @property
    def retry_aggregates(self) -> frozenset[tuple[str, bytes]]:
        """The ``(aggregate type, key)`` of every row that stays to be retried."""
        return frozenset((retry.row.aggregate_type, retry.row.key) for retry in self.retry)


@dataclass
class PendingBatch:
    """Rows handed to the producer, their futures, and what failed at once."""

    rows: list[OutboxRow]
    sent: list[OutboxRow] = field(default_factory=list)
    futures: list[Any] = field(default_factory=list)
    """``futures[i]`` answers for ``sent[i]``: two lists, not a list of pairs, so that a
    batch leaves no pair object per record for the garbage collector to walk."""
    rejected: list[tuple[str, str]] = field(default_factory=list)
    retry: list[Retry] = field(default_factory=list)
    failure: str | None = None


def _retry(row: OutboxRow, error: BaseException | None) -> Retry:
    return Retry(row, reason_for(error), "timeout" if error is None else type(error).__name__)


class ContractProducer:
    """One idempotent kafka-python producer; recreate it after a failed batch."""

    def __init__(self, kafka: KafkaSettings | str, settings: RelaySettings) -> None:
        """``kafka``: the cluster and how to reach it (servers and security:
        :mod:`outbox.kafka_clients`); a refused login raises
        :class:`~outbox.core.errors.BrokerAuthenticationError` within seconds."""
        self._settings = settings
        kafka = kafka_settings(kafka)
        delivery_ms = int(settings.delivery_timeout_seconds * 1000)
        # How the throughput settings were chosen (benchmarks/notes.md, "The relay's database
        # side"):
        # - linger: the relay hands the producer a whole read at once (5,000 rows by default),
        #   so record batches fill up by size, not by time; linger only holds the tail of each
        #   read and a lone event (5 ms by default: a latency bound, not a throughput lever).
        # - batch size 256 KiB: well over a thousand small events per produce request, so a
        #   read takes a few requests (each an acks=all round trip) rather than the dozens of
        #   kafka-python's 16 KiB default; OUTBOX_RELAY_MAX_REQUEST_BYTES caps a request.
        # - no compression: events are small JSON and the broker is near; gzip (the one codec
        #   without an extra package) cost the producer's network thread and the broker about
        #   0.5 s of CPU each per 100,000 events, on cores the relay is short of, to save
        #   bandwidth it is not short of.
        options = dict(
            client_options(kafka, client_id="outbox-relay"),
            metrics_enabled=False,  # its per-topic names collide for a.b and a_b
            acks="all",
            enable_idempotence=True,
            max_in_flight_requests_per_connection=5,
            linger_ms=settings.linger_ms,
            batch_size=262_144,
            max_request_size=settings.max_request_bytes,
            delivery_timeout_ms=delivery_ms,
            # Kafka requires delivery > linger + request timeout.
            request_timeout_ms=max(500, min(10_000, delivery_ms - settings.linger_ms - 1000)),
            max_block_ms=delivery_ms,
            retry_backoff_ms=100,
        )
        self._producer: Any = open_client(kafka, KafkaProducer, options)

    def publish(self, rows: Sequence[OutboxRow]) -> BatchOutcome:
        """Send every row and wait for the broker's answers (at most the delivery timeout)."""
        return self.wait(self.send(rows))

    def send(self, rows: Sequence[OutboxRow]) -> PendingBatch:
        """Hand every row to the producer, without waiting for acknowledgements."""
        pending = PendingBatch(rows=list(rows))
        for row in rows:
            headers = headers_for(
                event_id=row.id.encode(),
                event_type=row.event_type,
                traceparent=row.traceparent,
                headers=row.headers,
                position=str(row.position).encode(),
            )
            try:
                future = self._producer.send(
                    topic_for(row.aggregate_type), key=row.key, value=row.payload, headers=headers
                )
            except KafkaError as error:  # e.g. too large for max_request_size: raised at once
                if is_permanent(error):
                    pending.rejected.append((row.id, reason_for(error)))
                    continue
                if is_unreachable(error):  # the producer cannot take records: all wait
                    pending.failure = reason_for(error)
                    return pending
                pending.retry.append(_retry(row, error))
                continue
            pending.sent.append(row)
            pending.futures.append(future)
        return pending

    def wait(self, pending: PendingBatch) -> BatchOutcome:
        """The broker's answers for a sent batch, waiting at most the delivery timeout."""
        outcome = BatchOutcome(
            rejected=list(pending.rejected), retry=list(pending.retry), failure=pending.failure
        )
        if outcome.failure is not None:
            return outcome
        deadline = time.monotonic() + self._settings.delivery_timeout_seconds
        unreachable = False
        for row, future in zip(pending.sent, pending.futures, strict=True):
            if not future.is_done:
                with contextlib.suppress(KafkaError):  # judged below, from the future
                    future.get(timeout=max(0.0, deadline - time.monotonic()))
            if not future.is_done:
                outcome.retry.append(_retry(row, None))
                unreachable = True
            elif future.succeeded():
                outcome.delivered.append(row.id)
            elif is_permanent(future.exception):
                outcome.rejected.append((row.id, reason_for(future.exception)))
            else:
                outcome.retry.append(_retry(row, future.exception))
                unreachable = unreachable or is_unreachable(future.exception)
        if unreachable and not outcome.delivered and not outcome.rejected:
            outcome.failure = outcome.retry[0].reason
        return outcome

    def close(self) -> None:
        """Close without waiting for what is still unacknowledged (the batch is retried)."""
        # kafka-python raises when records were still in flight: they are abandoned.
        with contextlib.suppress(KafkaError):
            self._producer.close(timeout=0)
