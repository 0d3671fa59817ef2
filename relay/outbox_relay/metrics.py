"""The relay's Prometheus metrics, in a registry of their own (served on ``/metrics``).

No label or value ever carries a secret: no URL, no payload.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

__all__ = ["RelayMetrics"]


class RelayMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
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
            "outbox_relay_leader", "1 while this replica holds the leader lock.", registry=r
        )
        self.publishing = Gauge(
            "outbox_relay_publishing",
            "1 while the relay publishes (always in polling mode; in auto mode after taking "
            "over from CDC), 0 while it stands by.",
            registry=r,
        )
        self.leases_lost = Counter(
            "outbox_relay_leases_lost",
            "Times this replica stopped leading: another took the lease, or it could not "
            "renew it in time.",
            registry=r,
        )
        self.takeovers = Counter(
            "outbox_relay_takeovers", "Times the relay took over from CDC (auto mode).", registry=r
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
