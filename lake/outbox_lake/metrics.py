"""The lake job's Prometheus metrics, in a registry of their own (``/metrics`` of the job).

Same conventions as the relay's (relay/outbox_relay/metrics.py): ``outbox_lake_*`` names, seconds
for times, no secret and no payload in any label or value.

- freshness: seconds since the newest event in ``events`` was created (computed when
  scraped, so it grows while nothing lands);
- per batch: its duration and stages, the events it landed, the duplicates it dropped (within
  the batch and against the table), the conflicting copies it set aside, what it sent to
  quarantine (by kind);
- consumer lag per partition (records on the broker not yet in the lake), from the Kafka
  query's progress (``StreamingQueryListener``: the latest offsets Spark's source saw beside
  where its batch ended).
"""

from __future__ import annotations

import collections
import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

__all__ = ["LakeMetrics"]


class LakeMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.newest_event_time = 0.0
        self.completed_batches = 0
        self.batch_durations: collections.deque[float] = collections.deque(maxlen=10_000)
        """The last micro-batches' durations, seconds (benchmarks read them)."""
        self.freshness = Gauge(
            "outbox_lake_freshness_seconds",
            "Seconds since the newest event in the events table was created (0 before any).",
            registry=r,
        )
        self.freshness.set_function(
            lambda: time.time() - self.newest_event_time if self.newest_event_time else 0.0
        )
        self.last_batch_time = Gauge(
            "outbox_lake_last_batch_timestamp_seconds",
            "When the last micro-batch finished (Unix time).",
            registry=r,
        )
        self.batch_seconds = Histogram(
            "outbox_lake_batch_seconds",
            "Duration of a micro-batch, from its start to its last Delta commit.",
            buckets=(0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120),
            registry=r,
        )
        self.stage_seconds = Histogram(
            "outbox_lake_stage_seconds",
            "Time of each stage of a micro-batch: plan, write, shape, check, landed, dedup, "
            "quarantine, events, unpersist; the typed query's typed_types, typed_plan, "
            "typed_write, typed_landed, typed_commit (one job), typed_shape, typed_typed, "
            "typed_quarantine (two jobs).",
            ["stage"],
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30),
            registry=r,
        )
        self.events = Counter(
            "outbox_lake_events", "Events landed in the events table.", registry=r
        )
        self.duplicates = Counter(
            "outbox_lake_duplicates_dropped",
            "Copies of events already landed (or met twice in a batch), dropped.",
            registry=r,
        )
        self.conflicting = Counter(
            "outbox_lake_conflicting_copies",
            "Copies of an event id with content other than the first copy's, set aside.",
            registry=r,
        )
        self.quarantined = Counter(
            "outbox_lake_quarantined",
            "Rows sent to quarantine, by kind (record: not a usable event; typed: a typed row); "
            "conflicting copies are counted in outbox_lake_conflicting_copies.",
            ["kind"],
            registry=r,
        )
        self.lag = Gauge(
            "outbox_lake_consumer_lag",
            "Records on the broker not yet in the lake, per topic partition (broker end offsets).",
            ["topic", "partition"],
            registry=r,
        )
        self.batches = Counter("outbox_lake_batches", "Micro-batches landed.", registry=r)
        self.two_job_batches = Counter(
            "outbox_lake_two_job_batches",
            "Micro-batches landed by the two-job path, which classifies each copy: a record "
            "the JVM did not decide, an event id twice in the batch or a copy already landed "
            "(the others land in one Spark job).",
            registry=r,
        )
        self.typed_writes = Counter(
            "outbox_lake_typed_writes",
            "An aggregate type's rows of a typed batch written to its typed table, by path: "
            "one_job (the common case) or two_jobs (a new table, a field the table lacks, a row "
            "set aside or a copy already landed).",
            ["path"],
            registry=r,
        )

    def summary(self, seconds: float) -> str:
        """One line of what this job did (for its end): batches, events, what was dropped
        or set aside, and the rate."""

        def count(name: str, **labels: str) -> int:
            return int(self.registry.get_sample_value(f"{name}_total", labels) or 0)

        events = count("outbox_lake_events")
        aside = sum(count("outbox_lake_quarantined", kind=kind) for kind in ("record", "typed"))
        two_jobs = count("outbox_lake_two_job_batches")
        return (
            f"lake ingest: {count('outbox_lake_batches'):,} batches ({two_jobs:,} in two jobs), "
            f"{events:,} events landed, "
            f"{count('outbox_lake_duplicates_dropped'):,} duplicates dropped, {aside:,} rows "
            f"set aside ({count('outbox_lake_conflicting_copies'):,} conflicting copies), in "
            f"{seconds:,.1f} s ({events / max(seconds, 1e-9):,.0f} events/s)"
        )

    def progress(self, seconds: float) -> str:
        """One line of how far a running job has come (for long runs): batches and events
        so far, and the records still behind on the broker when measured."""
        events = int(self.registry.get_sample_value("outbox_lake_events_total") or 0)
        behind = [
            sample.value
            for metric in self.lag.collect()
            for sample in metric.samples
            if sample.name == "outbox_lake_consumer_lag"
        ]
        left = f", {int(sum(behind)):,} records behind on Kafka" if behind else ""
        return (
            f"lake ingest: {self.completed_batches:,} batches, {events:,} events landed so "
            f"far{left} ({seconds:,.0f} s)"
        )

    def saw_events(self, newest_event_time: float) -> None:
        self.newest_event_time = max(self.newest_event_time, newest_event_time)

    def batch_done(
        self, seconds: float, newest_event_time: float | None, *, one_job: bool = True
    ) -> None:
        """A micro-batch of the Kafka query has landed (``one_job``: by the one-job path)."""
        self.batches.inc()
        if not one_job:
            self.two_job_batches.inc()
        self.completed_batches += 1
        self.last_batch_time.set_to_current_time()
        self.batch_seconds.observe(seconds)
        self.batch_durations.append(seconds)
        if newest_event_time is not None:
            self.saw_events(newest_event_time)
