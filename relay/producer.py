"""The relay's Kafka side: publish a batch of outbox rows as contract records, and say how it went.

kafka-python with ``acks='all'`` and the idempotent producer: within a partition (one
aggregate), records land in send order and a retried send is not written twice. The broker's
answer sorts every row into one of three outcomes:

- acknowledged: the row may be deleted;
- refused for good (too large, invalid, not authorized: a non-retriable error): a dead letter
  with the broker's reason, never retried by itself;
- not acknowledged in time (broker down, paused, leader moving): the whole batch is published
  again later. Duplicates carry the same event id.
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
from relay.database import OutboxRow
from relay.settings import RelaySettings

__all__ = ["BatchOutcome", "ContractProducer", "PendingBatch"]


@dataclass
class BatchOutcome:
    delivered: list[str] = field(default_factory=list)
    rejected: list[tuple[str, str]] = field(default_factory=list)
    failure: str | None = None
    """Set when some row was neither acknowledged nor refused for good: retry the batch."""


@dataclass
class PendingBatch:
    """Rows handed to the producer, their futures, and what failed at once."""

    rows: list[OutboxRow]
    sent: list[tuple[str, Any]] = field(default_factory=list)
    rejected: list[tuple[str, str]] = field(default_factory=list)
    failure: str | None = None


def _reason(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"


def _retriable(error: BaseException) -> bool:
    return not isinstance(error, KafkaError) or bool(getattr(error, "retriable", False))


class ContractProducer:
    """One idempotent kafka-python producer; recreate it after a failed batch."""

    def __init__(self, bootstrap_servers: str, settings: RelaySettings) -> None:
        self._settings = settings
        delivery_ms = int(settings.delivery_timeout_seconds * 1000)
        self._producer: Any = KafkaProducer(
            bootstrap_servers=bootstrap_servers.split(","),
            client_id="outbox-relay",
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
                if _retriable(error):
                    pending.failure = _reason(error)
                    return pending
                pending.rejected.append((row.id, _reason(error)))
                continue
            pending.sent.append((row.id, future))
        return pending

    def wait(self, pending: PendingBatch) -> BatchOutcome:
        """The broker's answers for a sent batch, waiting at most the delivery timeout."""
        outcome = BatchOutcome(rejected=list(pending.rejected), failure=pending.failure)
        if outcome.failure is not None:
            return outcome
        deadline = time.monotonic() + self._settings.delivery_timeout_seconds
        for event_id, future in pending.sent:
            if not future.is_done:
                with contextlib.suppress(KafkaError):  # judged below, from the future
                    future.get(timeout=max(0.0, deadline - time.monotonic()))
            if not future.is_done:
                outcome.failure = outcome.failure or "not acknowledged within the delivery timeout"
            elif future.succeeded():
                outcome.delivered.append(event_id)
            elif _retriable(future.exception):
                outcome.failure = outcome.failure or _reason(future.exception)
            else:
                outcome.rejected.append((event_id, _reason(future.exception)))
        return outcome

    def close(self) -> None:
        """Close without waiting for what is still unacknowledged (the batch is retried)."""
        # kafka-python raises when records were still in flight: they are abandoned.
        with contextlib.suppress(KafkaError):
            self._producer.close(timeout=0)
