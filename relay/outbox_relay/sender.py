"""Sending rows to Kafka for the leader: one producer, and the aggregates that wait.

The producer sorts the broker's answers (relay/outbox_relay/producer.py). Rows refused for a reason
that can pass stay in the table: the read floor is held below them (relay/outbox_relay/horizon.py)
and their aggregates wait (relay/outbox_relay/parking.py), so no newer event of theirs overtakes
them, while every other aggregate goes on. The next read was built while the refused row was in
flight, so it skipped that row: its rows of the refused aggregate are held too, even when the
pause is over before they would be sent (:meth:`Sender.admit`). After such a refusal the
producer is replaced: its state may be what the broker refused (``OutOfOrderSequenceNumber``,
``UnknownProducerId``, epochs).
A batch of which nothing was acknowledged because the broker did not answer raises
:class:`BatchNotAcknowledged`: the relay steps back and publishes it again later.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection

from outbox.settings import KafkaSettings
from outbox.tracing import sending
from outbox_relay.database import OutboxRow
from outbox_relay.horizon import Horizon
from outbox_relay.metrics import RelayMetrics
from outbox_relay.parking import Parking
from outbox_relay.producer import BatchOutcome, ContractProducer
from outbox_relay.settings import RelaySettings

__all__ = ["Aggregate", "BatchNotAcknowledged", "Sender"]

log = logging.getLogger("outbox.relay")

Aggregate = tuple[str, bytes]


class BatchNotAcknowledged(Exception):
    """Nothing of the batch was acknowledged and the broker did not answer."""


class Sender:
    def __init__(
        self,
        kafka: KafkaSettings | str,
        settings: RelaySettings,
        *,
        metrics: RelayMetrics,
        horizon: Horizon,
        check_lease: Callable[[], None],
    ) -> None:
        self._kafka = kafka
        self._settings = settings
        self._metrics = metrics
        self._horizon = horizon
        self._check_lease = check_lease
        self._parking = Parking(settings.retry_backoff_seconds, settings.max_backoff_seconds)
        self._producer: ContractProducer | None = None

    def open(self) -> None:
        """Make the producer if there is none: it reaches the cluster, or raises (a broker
        that does not answer, a login or an ACL refused)."""
        if self._producer is None:
            self._producer = ContractProducer(self._kafka, self._settings)

    def publish(self, rows: list[OutboxRow]) -> BatchOutcome:
        """Send ``rows`` and wait for the broker; a batch not acknowledged raises (retried)."""
        self._check_lease()
        self.open()
        assert self._producer is not None
        started = time.monotonic()
        # A broker error or an unacknowledged batch ends the span with an error status, by
        # the error's type only: the failure's text may quote a record.
        with sending([row.traceparent for row in rows]) as span:
            outcome = self._producer.publish(rows)
            if span is not None:
                span.set_attribute("outbox.delivered", len(outcome.delivered))
                span.set_attribute("outbox.retried", len(outcome.retry))
                span.set_attribute("outbox.rejected", len(outcome.rejected))
            if outcome.failure is not None:
                self.close()
                raise BatchNotAcknowledged(f"{len(rows)} rows: {outcome.failure}")
        self._metrics.publish_seconds.observe(time.monotonic() - started)
        delivered = set(outcome.delivered)
        self._parking.delivered_all(
            (row.aggregate_type, row.key) for row in rows if row.id in delivered
        )
        if outcome.retry:
            self.close()
            now = time.monotonic()
            for retry in outcome.retry:
                row = retry.row
                self._horizon.hold(row.position)
                pause = self._parking.park((row.aggregate_type, row.key), now, row.position)
                self._metrics.retried.labels(retry.error).inc()
                log.warning(
                    "broker did not take event %s (aggregate %s/%s), retrying in %.1f s: %s",
                    row.id,
                    row.aggregate_type,
                    row.key.decode(errors="replace"),
                    pause,
                    retry.reason.splitlines()[0][:300],
                )
            self._metrics.parked.set(self._parking.count(now))
        if self._horizon.held:  # only this thread holds and releases: no list while none
            retry_ids = outcome.retry_ids
            self._horizon.release([row.position for row in rows if row.id not in retry_ids])
        return outcome

    def waiting(self) -> dict[Aggregate, int]:
        """The aggregates whose rows the next read leaves out, each with the position of its
        first waiting row: that read's floor stays below it (relay/outbox_relay/horizon.py)."""
        return self._parking.parked(time.monotonic())  # type: ignore[return-value]

    def admit(
        self, rows: list[OutboxRow], *, refused_while_read: Collection[Aggregate] = ()
    ) -> list[OutboxRow]:
        """The rows that may be sent now. The others stay in the table, held: those of an
        aggregate that waits, and those of an aggregate in ``refused_while_read``, refused by
        the batch that was in flight while ``rows`` were read. That read skipped the refused
        row (it was in flight), so what it found of the aggregate is newer than a row that
        waits, even when the pause is over by now (a database cycle longer than the pause)."""
        now = time.monotonic()
        parked = self._parking.count(now)
        self._metrics.parked.set(parked)
        if not parked and not refused_while_read:
            return rows
        admitted = []
        for row in rows:
            aggregate = (row.aggregate_type, row.key)
            if aggregate in refused_while_read or self._parking.is_parked(aggregate, now):
                self._horizon.hold(row.position)
            else:
                admitted.append(row)
        return admitted

    def reset(self) -> None:
        """A new term as leader: no aggregate waits (the floor starts from scratch too)."""
        self._parking.clear()

    def close(self) -> None:
        """Drop the producer (what is in flight is abandoned: published again later)."""
        if self._producer is not None:
            self._producer.close()
            self._producer = None
