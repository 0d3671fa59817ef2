"""The relay's loop: lead, read, publish, delete; in auto mode, only when CDC does not.

Replicas share the work in polling mode: the outbox's aggregates fall into 32 slices, and
each replica publishes the slices whose leases it holds, a fair share of them
(relay/outbox_relay/slices.py; the leases live in PostgreSQL, renewed by each replica's
session, which does all its work: relay/outbox_relay/database.py). Ordering per aggregate
needs one reader in position order per aggregate: one replica per slice. A replica that
joins gets its share within ``leader_retry_seconds`` (the others hand theirs back between
batches); the slices of one that ends are taken within ``leader_retry_seconds`` of its
session ending (crash, kill), or within ``lease_seconds + leader_retry_seconds`` of its last
renewal when it is cut off (network loss, a frozen process): it stops sending before its
leases end. In auto and cleanup modes one replica holds every slice (it follows CDC's one
stream) and the others stand by.

Faults: a database error drops the session (and leadership) and reconnects with backoff,
except a connection refused over TLS (:class:`~outbox.core.errors.DatabaseTlsError`: a
certificate not trusted, or not for the host), which stops the relay with the reason;
a batch the broker did not acknowledge at all is published again (same event ids) after a
pause that doubles up to ``max_backoff_seconds``; a record the broker refuses for good becomes
a dead letter; a record refused for a reason that can pass stays, and only its aggregate
waits (relay/outbox_relay/parking.py) while the others go on. ``stop`` (SIGTERM) lets the batch in
flight finish: published, then deleted, and hands the slices back.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import psycopg
from kafka.errors import KafkaError

from outbox.core.errors import (
    BrokerAuthenticationError,
    BrokerAuthorizationError,
    BrokerError,
    DatabaseError,
    OutboxError,
)
from outbox.core.tables import DEFAULT_CDC_TOPIC_PREFIX, OutboxTables, cdc_heartbeat_topic
from outbox.settings import KafkaSettings, kafka_settings
from outbox_relay.cdc_watch import CdcWatch
from outbox_relay.checks import check_database
from outbox_relay.database import LeaseLost, OutboxRow, RelayDatabase
from outbox_relay.handover import Handover
from outbox_relay.health import Liveness
from outbox_relay.horizon import Horizon
from outbox_relay.metrics import RelayMetrics
from outbox_relay.producer import BatchOutcome
from outbox_relay.sender import Aggregate, BatchNotAcknowledged, Sender
from outbox_relay.settings import RelayMode, RelaySettings
from outbox_relay.slices import SLICES, describe

__all__ = ["Relay"]

log = logging.getLogger("outbox.relay")

_BACKLOG_EVERY_SECONDS = 2.0
_UNBLOCK_EVERY_SECONDS = 15.0
"""How often a relay that took over looks for hanging transactions on Connect's offsets topic."""


@dataclass(frozen=True)
class _Read:
    """Rows to publish, and the floor the read allows once they (and all before) are gone."""

    rows: list[OutboxRow]
    candidate: int


@dataclass(frozen=True)
class _InFlight:
    """An acknowledged batch, waiting to leave the table."""

    rows: list[OutboxRow]
    outcome: BatchOutcome
    candidate: int


class Relay:
    def __init__(
        self,
        settings: RelaySettings,
        *,
        database_url: str,
        kafka: KafkaSettings | str,
        tables: OutboxTables,
        cdc_topic_prefix: str = DEFAULT_CDC_TOPIC_PREFIX,
        metrics: RelayMetrics | None = None,
        liveness: Liveness | None = None,
    ) -> None:
        """``kafka``: the cluster and how to reach it (``OUTBOX_KAFKA_*``; a plain
        ``host:port`` list is a cluster without security). ``cdc_topic_prefix``: the
        connector's (OUTBOX_CONNECT_TOPIC_PREFIX); with ``tables`` it names the CDC heartbeat
        topic auto mode watches, unless the settings name one."""
        self.settings = settings
        self.cdc_heartbeat_topic = settings.cdc_heartbeat_topic or cdc_heartbeat_topic(
            cdc_topic_prefix, tables
        )
        self.metrics = metrics if metrics is not None else RelayMetrics()
        self.liveness = liveness or Liveness(settings.delivery_timeout_seconds + 30)
        self._kafka = kafka_settings(kafka)
        self._database = RelayDatabase(
            database_url,
            tables,
            settings.lease_seconds,
            balance_seconds=settings.leader_retry_seconds,
        )
        self._tables = tables
        self._checked = False
        self._horizon = Horizon()
        self._handover = Handover(settings.grace_seconds)
        self._sender = Sender(
            self._kafka,
            settings,
            metrics=self.metrics,
            horizon=self._horizon,
            check_lease=self._database.check_lease,
        )
        self._watch: CdcWatch | None = None
        self._backoff = settings.retry_backoff_seconds
        self._backlog_due = 0.0
        self._unblock_due = 0.0
        self._leading = False
        for mode in RelayMode:
            self.metrics.mode.labels(mode.value).set(1 if mode is settings.mode else 0)

    # -- the loop --------------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        """Run until ``stop`` is set; the batch in flight then finishes."""
        log.info(
            "relay starting",
            extra={"mode": self.settings.mode.value, "kafka": self._kafka.describe()},
        )
        try:
            while not stop.is_set():
                try:
                    self._lead_and_work(stop)
                except LeaseLost as lost:
                    log.warning("%s", lost)
                    self.metrics.leases_lost.inc()
                    self._step_down()
                    stop.wait(self.settings.leader_retry_seconds)
                except DatabaseError as error:  # refused for good (TLS): no retry cures it
                    self.metrics.errors.labels("database").inc()
                    log.error("relay stopped: %s", error)
                    raise
                except psycopg.Error as error:
                    self._fault("database", error, stop)
                except (BrokerAuthenticationError, BrokerAuthorizationError) as error:
                    # Kafka refused who we are or what we asked: an error, said each time
                    # (with the fix), retried with backoff: a secret or an ACL may be fixed.
                    self._fault("broker_security", error, stop, level=logging.ERROR)
                except (KafkaError, BrokerError, BatchNotAcknowledged) as error:
                    self._fault("broker", error, stop)
        finally:
            with contextlib.suppress(psycopg.Error):
                self._database.release_leases()  # the other replicas take them at once
            self._step_down()
            self.liveness.state = "stopped"
            log.info("relay stopped")

    def _lead_and_work(self, stop: threading.Event) -> None:
        self.liveness.state = "connecting to the database"
        self._database.connect()
        if not self._checked:  # once: a broken assumption stops the relay (not retried)
            check_database(self._database.connection, self._tables, self.settings.mode)
            self._checked = True
        # A relay that cannot reach Kafka takes no slice: it would hold its share back until
        # its first batch failed, again after every backoff.
        self.liveness.state = "connecting to Kafka"
        self._sender.open()
        self._database.join(whole=self.settings.mode is not RelayMode.POLLING)
        self.liveness.ready = True
        while not stop.is_set():
            self.liveness.beat()
            changed = self._database.balance()
            self.metrics.slices_free.set(self._database.free_slices)
            if changed or self._leading != bool(self._database.slices):
                self._take_slices()
            if not self._database.slices:
                self.liveness.state = "standby: other replicas publish every slice"
                if stop.wait(self._database.balance_seconds):
                    return
                continue
            if self.settings.mode is RelayMode.POLLING:
                self.liveness.state = "leader: publishing (polling mode)"
                self.metrics.publishing.set(1)
                self._relay_polling(stop)
                continue
            while not stop.is_set() and not self._database.rebalance_wanted:
                self.liveness.beat()
                self._database.renew_if_due()
                busy = self._step_auto()
                self._backoff = self.settings.retry_backoff_seconds
                self._report_backlog()
                if not busy:
                    stop.wait(self.settings.idle_seconds)

    def _take_slices(self) -> None:
        """The slices held changed (or this relay starts): the read floor starts again, no
        aggregate waits; nothing is in flight (the loop calls it between batches)."""
        slices = self._database.slices
        self.metrics.slices.set(len(slices))
        self.metrics.rebalances.inc()
        self._horizon.reset()
        self._sender.reset()
        if not slices:
            if self._leading:
                log.info("no slice left to this replica: it stands by")
            self._leading = False
            self.metrics.leader.set(0)
            self.metrics.publishing.set(0)
            return
        log.info(
            "this replica publishes slices %s (%d of %d)",
            describe(slices),
            len(slices),
            SLICES,
        )
        self._leading = True
        self.metrics.leader.set(1)

    # -- polling mode: a pipeline ------------------------------------------------------------

    def _relay_polling(self, stop: threading.Event) -> None:
        """Publish batch after batch; the database work of one overlaps the sending of another.

        One database thread, one connection (the leader's session), statements in order:
        each cycle deletes the batch acknowledged last, then reads the next one (the server
        leaves out the rows of the batch still being sent), while this thread sends the
        current batch and waits for its acknowledgements. Records leave in position order; a
        row leaves the table only after its record was acknowledged; the floor moves only over
        delivered rows. A failure abandons what is in flight: those rows are published again.
        """
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="relay-db") as database:
            acked: _InFlight | None = None
            read = self._database_cycle(None, ())
            # The aggregates refused by the batch that was in flight while `read` was read.
            refused_while_read: frozenset[Aggregate] = frozenset()
            while not stop.is_set() and not self._database.rebalance_wanted:
                self.liveness.beat()
                rows = self._sender.admit(read.rows, refused_while_read=refused_while_read)
                if not rows:
                    # Nothing to send (nothing new, or only aggregates that wait): finish what
                    # was acknowledged, then the read's floor (held below waiting rows).
                    following = self._database_cycle(acked, ())
                    acked = None
                    self._horizon.advance(read.candidate)
                    self.metrics.floor.set(self._horizon.floor)
                    self._backoff = self.settings.retry_backoff_seconds
                    waiting = bool(read.rows) or not following.rows
                    if waiting and stop.wait(self.settings.idle_seconds):
                        break
                    read, refused_while_read = following, frozenset()
                    continue
                in_flight = [row.position for row in rows]
                sending = threading.Event()
                cycle = database.submit(self._database_cycle, acked, in_flight, sending)
                try:
                    outcome = self._sender.publish(rows)
                finally:
                    sending.set()
                    following = cycle.result()  # never leave the database thread running alone
                acked = _InFlight(rows, outcome, read.candidate)
                self._backoff = self.settings.retry_backoff_seconds
                read, refused_while_read = following, outcome.retry_aggregates
            if acked is not None:  # stopping or rebalancing: the acknowledged batch leaves first
                self._finish(acked)

    def _database_cycle(
        self,
        acked: _InFlight | None,
        in_flight: Sequence[int],
        sending: threading.Event | None = None,
    ) -> _Read:
        """Finish the acknowledged batch, then read the next, leaving out the rows at the
        positions ``in_flight`` (runs on the database thread); then, while the batch in
        flight is being sent (until ``sending`` is set), keep the leases renewed."""
        if acked is not None:  # first: deleting what the broker took needs no lease
            self._finish(acked)
        self._database.renew_if_due()
        self._report_backlog()
        self._observe_horizon()
        limit = self.settings.batch_size
        waiting = self._sender.waiting()  # the read's exclusions and their floor, taken together
        read = self._database.read(self._horizon.floor, limit, list(waiting), in_flight)
        candidate = self._horizon.candidate(
            [row.position for row in read], limit=limit, excluded=waiting.values()
        )
        if sending is not None:
            self._database.renew_while(sending)
        return _Read(read, candidate)

    def _finish(self, batch: _InFlight) -> None:
        """Delete what the broker took, dead-letter what it refused; the floor moves on."""
        outcome = batch.outcome
        positions = [row.position for row in batch.rows]
        self._database.finish(
            outcome.delivered, outcome.rejected, between=(min(positions), max(positions))
        )
        self._horizon.advance(batch.candidate)
        self.metrics.floor.set(self._horizon.floor)
        self.metrics.published.inc(len(outcome.delivered))
        self.metrics.batch_rows.observe(len(batch.rows))
        for event_id, reason in outcome.rejected:
            self.metrics.dead_lettered.inc()
            log.error("broker refused event %s, moved to dead letters: %s", event_id, reason)

    def _fault(
        self, kind: str, error: BaseException, stop: threading.Event, level: int = logging.WARNING
    ) -> None:
        self.metrics.errors.labels(kind).inc()
        self.liveness.state = f"retrying after a {kind} error"
        log.log(
            level,
            "relay %s error, retrying in %.1f s: %s",
            kind,
            self._backoff,
            f"{type(error).__name__}: {error}".splitlines()[0],
        )
        self._step_down()
        stop.wait(self._backoff)
        self._backoff = min(self._backoff * 2, self.settings.max_backoff_seconds)

    def _step_down(self) -> None:
        """Drop the session (and with it leadership), the producer and the CDC watch."""
        was_leader, self._leading = self._leading, False
        self.metrics.leader.set(0)
        self.metrics.slices.set(0)
        self.liveness.ready = False
        self._database.close()
        self._sender.close()
        if self._watch is not None:
            self._watch.close()
            self._watch = None
        if was_leader:
            log.info("no longer leader")

    # -- auto mode: one step at a time -------------------------------------------------------

    def _step_auto(self) -> bool:
        self._unblock_connect()
        if not self._follow_cdc():
            self.liveness.state = "leader: catching up with CDC's records on Kafka"
            return False  # the watch is still catching up: too early to judge CDC
        self._observe_horizon()
        limit = self.settings.batch_size
        waiting = self._sender.waiting()
        rows = self._database.read(self._horizon.floor, limit, list(waiting))
        if not self._takes_over(rows):
            first_left = rows[0].position if rows else None
            self._horizon.delivered(
                [], limit=limit, first_left=first_left, excluded=waiting.values()
            )
            self.metrics.floor.set(self._horizon.floor)
            if self._handover.publishing:  # took over, and nothing is left: drained
                self._step_back_if_cdc_streams()
            self.liveness.state = (
                "leader: publishing, CDC does not deliver (took over)"
                if self._handover.publishing
                else "leader: cleaning up what CDC delivered (cleanup mode)"
                if self.settings.mode is RelayMode.CLEANUP
                else "leader: standing by, CDC delivers"
            )
            return False
        self.liveness.state = "leader: publishing, CDC does not deliver (took over)"
        candidate = self._horizon.candidate(
            [row.position for row in rows], limit=limit, excluded=waiting.values()
        )
        rows = self._sender.admit(rows)
        if rows:
            self._finish(_InFlight(rows, self._sender.publish(rows), candidate))
        else:
            self._horizon.advance(candidate)
        if len(rows) < limit:
            self._step_back_if_cdc_streams()
        return len(rows) >= limit

    def _unblock_connect(self) -> None:
        """While the relay has taken over (CDC does not deliver), every
        :data:`_UNBLOCK_EVERY_SECONDS`: abort the hanging transactions on Connect's offsets
        topic, which hold a restarted exactly-once worker for ever (seen after the broker
        and Connect were killed together: docs/troubleshooting.md)."""
        topic = self.settings.connect_offsets_topic
        if not topic or self.settings.mode is not RelayMode.AUTO:
            return
        if not self._handover.publishing:
            return
        now = time.monotonic()
        if now < self._unblock_due:
            return
        self._unblock_due = now + _UNBLOCK_EVERY_SECONDS
        from outbox_connect.open_transactions import unblock

        try:
            aborted, _left = unblock(
                self._kafka, topic, idle_seconds=self.settings.connect_unblock_idle_seconds
            )
        except OutboxError as error:  # the broker down meanwhile: next time
            log.info("Kafka Connect's offsets topic %s not checked: %s", topic, error)
            return
        for transaction in aborted:
            self.metrics.connect_unblocked.inc()
            log.warning(
                "aborted a hanging transaction that held Kafka Connect: %s",
                transaction.describe(),
            )

    def _step_back_if_cdc_streams(self) -> None:
        """Drained (the last read was not full): step back once CDC streams again. Also when
        the outbox is empty: a relay that took over must not publish for ever."""
        if self._handover.drained():
            self.metrics.stepbacks.inc()
            self.metrics.publishing.set(0)
            log.info("CDC delivers again: relay steps back")

    def _observe_horizon(self) -> None:
        """Three statements, three transactions, in this order (see relay/outbox_relay/horizon.py);
        the xid only when the sequence moved, so an idle relay consumes no transaction ids."""
        last = self._database.last_position()
        if last > self._horizon.observed:
            xid_bound = self._database.new_xid()
            xmin = self._database.oldest_running_xid()
            self._horizon.observe(last_position=last, xid_bound=xid_bound, xmin=xmin)
        elif self._horizon.observed > self._horizon.final:
            self._horizon.settle(self._database.oldest_running_xid())

    def _takes_over(self, rows: list[OutboxRow]) -> bool:
        if self.settings.mode is RelayMode.CLEANUP:
            return False  # never publishes: deletes what CDC delivered, nothing else
        was_publishing = self._handover.publishing
        publish = self._handover.should_publish(
            [row.id for row in rows], time.monotonic(), wall_now=time.time()
        )
        if publish and not was_publishing:
            self.metrics.takeovers.inc()
            self.metrics.publishing.set(1)
            log.warning(
                "rows wait for CDC longer than %.1f s: relay takes over",
                self.settings.grace_seconds,
            )
        return publish

    def _follow_cdc(self) -> bool:
        """Delete what CDC delivered; True once the watch has caught up with Kafka."""
        if self._watch is None:
            self._watch = CdcWatch(
                self._kafka,
                heartbeat_topic=self.cdc_heartbeat_topic,
                offsets=self._database.cdc_offsets(),
            )
        deliveries = self._watch.poll(timeout_seconds=0.05)
        if deliveries.latest_heartbeat is not None:
            self._handover.cdc_heartbeat(deliveries.latest_heartbeat)
        if deliveries.undecodable:
            self.metrics.cdc_undecodable.inc(len(deliveries.undecodable))
        if deliveries.event_ids or deliveries.offsets:
            removed = self._database.remove_delivered(deliveries.event_ids, deliveries.offsets)
            self.metrics.cdc_confirmed.inc(removed)
        return self._watch.caught_up

    def _report_backlog(self) -> None:
        now = time.monotonic()
        if now < self._backlog_due:
            return
        self._backlog_due = now + _BACKLOG_EVERY_SECONDS
        backlog = self._database.backlog()
        self.metrics.undelivered.set(backlog.rows)
        self.metrics.slices_free.set(self._database.free_slices)
        self.metrics.oldest_age.set(backlog.oldest_age_seconds)
        self.metrics.dead_letters.set(backlog.dead_letters)
        for table, rows in backlog.table_rows.items():
            self.metrics.table_rows.labels(table).set(rows)
