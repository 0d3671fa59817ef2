"""Reconcile's result as Prometheus metrics, for node_exporter's textfile collector.

``outbox reconcile --metrics-file /var/lib/node_exporter/textfile/outbox_reconcile.prom``
writes them after each run (atomically), so the alert rules in ``monitoring/`` can fire on
findings and on a reconcile that stopped running. No label carries a secret or a payload:
only finding kinds and aggregate types.
"""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Gauge, write_to_textfile

from outbox_reconcile.findings import FINDING_KINDS, Report

__all__ = ["ReconcileMetrics"]


class ReconcileMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.findings = Gauge(
            "outbox_reconcile_findings",
            "Findings of the last reconcile run, by kind and aggregate type.",
            ["kind", "aggregate_type"],
            registry=r,
        )
        self.last_run = Gauge(
            "outbox_reconcile_last_run_timestamp_seconds",
            "When the last reconcile run finished (Unix time).",
            registry=r,
        )
        self.duration = Gauge(
            "outbox_reconcile_duration_seconds", "How long the last run took.", registry=r
        )
        self.kafka_events = Gauge(
            "outbox_reconcile_kafka_events", "Distinct events read from Kafka.", registry=r
        )
        self.lake_events = Gauge(
            "outbox_reconcile_lake_events", "Distinct events read from the lake.", registry=r
        )
        self.pending = Gauge(
            "outbox_reconcile_lake_pending_events",
            "Events on Kafka the lake has not taken in yet.",
            registry=r,
        )

        self.slot_wal = Gauge(
            "outbox_reconcile_slot_retained_wal_bytes",
            "WAL each logical replication slot retains, measured by the last run.",
            ["slot"],
            registry=r,
        )

    def record(self, report: Report) -> None:
        for kind in FINDING_KINDS:
            self.findings.labels(kind=kind, aggregate_type="").set(0)
        for finding in report.findings:
            self.findings.labels(kind=finding.kind, aggregate_type=finding.aggregate_type).set(
                finding.count
            )
        self.last_run.set(time.time())
        self.duration.set(report.figures.get("seconds", 0))
        self.kafka_events.set(report.figures.get("kafka_events", 0))
        self.lake_events.set(report.figures.get("lake_events", 0))
        self.pending.set(report.figures.get("lake_pending_ingest", 0))
        for slot, retained in report.slots.items():
            self.slot_wal.labels(slot=slot).set(retained)

    def write(self, path: str) -> None:
        write_to_textfile(path, self.registry)
