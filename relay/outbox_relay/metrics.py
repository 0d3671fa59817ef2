"""The relay's Prometheus metrics, in a registry of their own (served on ``/metrics``).

No label or value ever carries a secret: no URL, no payload.

Most gauges are set by the relay's loop (the leader's). The replication slots' state comes
from :class:`SlotWatch` instead, which reads it on a thread and a connection of its own, in
every replica, leader or not: the WAL a slot retains is what fills the database's disk when
CDC stops, so it is watched live whatever the relay is doing, and a scrape never waits on
the database (``/healthz`` shares the HTTP thread).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from outbox_relay.checks import SlotState, replication_slots

__all__ = ["WAL_STATUSES", "RelayMetrics", "SlotMetrics", "SlotWatch"]

log = logging.getLogger("outbox.relay.metrics")

WAL_STATUSES = ("reserved", "extended", "unreserved", "lost")


class SlotWatch:
    """The replication slots, read every ``interval_seconds`` on a daemon thread and a
    connection of its own (never the leader's session): dropped after a failure, opened
    again at the next read. :meth:`latest` is what the last read found, or None when it
    failed (or is older than three intervals)."""

    def __init__(
        self, conninfo: str, *, interval_seconds: float = 10.0, timeout_seconds: float = 5.0
    ) -> None:
        self._conninfo = conninfo
        self._interval = interval_seconds
        self._timeout = timeout_seconds
        self._connection: psycopg.Connection[Any] | None = None
        self._latest: tuple[float, list[SlotState]] | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="relay-slots", daemon=True)

    def start(self) -> SlotWatch:
        self._thread.start()
        return self

    def latest(self) -> list[SlotState] | None:
        found = self._latest
        if found is None or time.monotonic() - found[0] > 3 * self._interval:
            return None
        return found[1]

    def refresh(self) -> None:
        """Read the slots now (the thread does, every interval)."""
        try:
            if self._connection is None or self._connection.closed:
                self._connection = psycopg.connect(
                    self._conninfo,
                    autocommit=True,
                    application_name="outbox-relay-metrics",
                    connect_timeout=max(1, round(self._timeout)),
                    options=f"-c statement_timeout={int(self._timeout * 1000)}",
                )
            self._latest = (time.monotonic(), replication_slots(self._connection))
        except psycopg.Error as error:
            log.warning("cannot read the replication slots: %s", type(error).__name__)
            self._latest = None
            self._disconnect()

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self._timeout + 1)
        self._disconnect()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.refresh()
            self._stop.wait(self._interval)

    def _disconnect(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            connection.close()


class SlotMetrics(Collector):
    """``outbox_relay_slot_*`` from the latest read of the slots.

    Without a source (a relay built without a database URL, as in tests) the families are
    exported without samples; ``outbox_relay_slot_read_ok`` is 0 when the slots could not be
    read lately.
    """

    def __init__(self, latest: Callable[[], list[SlotState] | None] | None = None) -> None:
        self._latest = latest

    def collect(self) -> Iterator[GaugeMetricFamily]:
        retained = GaugeMetricFamily(
            "outbox_relay_slot_retained_wal_bytes",
            "WAL a replication slot of the outbox's database retains (from its restart_lsn "
            "to the current WAL position).",
            labels=["slot"],
        )
        active = GaugeMetricFamily(
            "outbox_relay_slot_active",
            "1 while a client (Debezium) streams from the slot.",
            labels=["slot"],
        )
        status = GaugeMetricFamily(
            "outbox_relay_slot_wal_status",
            "1 for the slot's wal_status: reserved, extended (beyond max_wal_size), "
            "unreserved (removed at the next checkpoint) or lost (invalidated).",
            labels=["slot", "status"],
        )
        ok = GaugeMetricFamily(
            "outbox_relay_slot_read_ok",
            "1 when the replication slots were read lately, 0 when they could not be.",
        )
        if self._latest is not None:
            slots = self._latest()
            ok.add_metric([], 0 if slots is None else 1)
            for slot in slots or []:
                if slot.retained_wal_bytes is not None:
                    retained.add_metric([slot.name], slot.retained_wal_bytes)
                active.add_metric([slot.name], 1 if slot.active else 0)
                for name in WAL_STATUSES:
                    status.add_metric([slot.name, name], 1 if slot.wal_status == name else 0)
        yield from (retained, active, status, ok)


class RelayMetrics:
    def __init__(self, *, slots: Callable[[], list[SlotState] | None] | None = None) -> None:
        """``slots``: the latest state of the replication slots (:meth:`SlotWatch.latest`)."""
        self.registry = CollectorRegistry()
        r = self.registry
        r.register(SlotMetrics(slots))
        self.undelivered = Gauge(
            "outbox_relay_undelivered_rows", "Rows in the outbox not yet delivered.", registry=r
        )
        self.oldest_age = Gauge(
            "outbox_relay_oldest_undelivered_age_seconds",
            "Age of the oldest undelivered event (from its creation).",
            registry=r,
        )
        self.published = Counter(
            "outbox_relay_published",
            "Events the relay published and the broker acknowledged.",
            registry=r,
        )
        self.publish_seconds = Histogram(
            "outbox_relay_publish_seconds",
            "Time from sending a batch to the broker's last acknowledgement.",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            registry=r,
        )
        self.batch_rows = Histogram(
            "outbox_relay_batch_rows",
            "Rows per published batch.",
            buckets=(1, 10, 100, 500, 1000, 2000, 5000, 10000),
            registry=r,
        )
        self.mode = Gauge(
            "outbox_relay_mode",
            "The configured mode (1 for the current one).",
            ["mode"],
            registry=r,
        )
        self.leader = Gauge(
            "outbox_relay_leader",
            "1 while this replica publishes some slices of the outbox (leads them).",
            registry=r,
        )
        self.slices = Gauge(
            "outbox_relay_slices",
            "How many of the outbox's 32 slices this replica publishes (the replicas share "
            'them: docs/operations.md, "Several relays").',
            registry=r,
        )
        self.slices_free = Gauge(
            "outbox_relay_slices_free",
            "Slices no live replica held at this replica's last look: for seconds while a "
            "replica joins or ends; lasting, their rows wait (alert on it).",
            registry=r,
        )
        self.rebalances = Counter(
            "outbox_relay_rebalances",
            "Times this replica's slices changed: a replica joined, ended or handed some back.",
            registry=r,
        )
        self.publishing = Gauge(
            "outbox_relay_publishing",
            "1 while the relay publishes (always in polling mode; in auto mode after taking "
            "over from CDC), 0 while it stands by.",
            registry=r,
        )
        self.leases_lost = Counter(
            "outbox_relay_leases_lost",
            "Times this replica stopped publishing: another took one of its slices, or it "
            "could not renew its leases in time.",
            registry=r,
        )
        self.takeovers = Counter(
            "outbox_relay_takeovers", "Times the relay took over from CDC (auto mode).", registry=r
        )
        self.connect_unblocked = Counter(
            "outbox_relay_connect_unblocked",
            "Hanging transactions on Kafka Connect's offsets topic the relay aborted (auto "
            "mode): each held a Connect worker at start-up.",
            registry=r,
        )
        self.stepbacks = Counter(
            "outbox_relay_stepbacks",
            "Times the relay stepped back for CDC (auto mode).",
            registry=r,
        )
        self.cdc_confirmed = Counter(
            "outbox_relay_cdc_confirmed",
            "Rows deleted because their CDC record was seen on Kafka (auto mode).",
            registry=r,
        )
        self.cdc_undecodable = Counter(
            "outbox_relay_cdc_undecodable_records",
            "Records on CDC's topics no reader can take at its word (auto mode; each logged "
            "with its topic, partition and offset).",
            registry=r,
        )
        self.dead_lettered = Counter(
            "outbox_relay_dead_lettered", "Rows moved to the dead-letter table.", registry=r
        )
        self.dead_letters = Gauge(
            "outbox_relay_dead_letters", "Rows in the dead-letter table.", registry=r
        )
        self.retried = Counter(
            "outbox_relay_retried",
            "Records the broker did not take for a reason that can pass (authorization, "
            "producer state, timeout), by error: the row stays and its aggregate waits.",
            ["error"],
            registry=r,
        )
        self.parked = Gauge(
            "outbox_relay_parked_aggregates",
            "Aggregates waiting after such a failure (their rows stay in the outbox).",
            registry=r,
        )
        self.table_rows = Gauge(
            "outbox_table_rows_estimate",
            "PostgreSQL's row estimate (pg_class.reltuples) of each table that grows: outbox, "
            "dead letters, dedup keys, inbox claims and dead letters, heartbeat.",
            ["table"],
            registry=r,
        )
        self.errors = Counter(
            "outbox_relay_errors",
            "Failures, by kind (database, broker, broker_security).",
            ["kind"],
            registry=r,
        )
        self.floor = Gauge(
            "outbox_relay_read_floor",
            "Position below which every row is final and delivered.",
            registry=r,
        )
