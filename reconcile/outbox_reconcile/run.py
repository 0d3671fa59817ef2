"""One reconcile run: outbox, then Kafka, then the lake, into evidence on disk; then compare.

The order is what makes a run on a live pipeline free of false findings: each source is
read after the one that feeds it (the outbox before Kafka, Kafka before the lake), and each
comparison allows for what moved on meanwhile (see :mod:`outbox_reconcile.findings`).
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from outbox.core.errors import ConfigurationError
from outbox.core.tables import OutboxTables
from outbox.settings import KafkaSettings
from outbox_lake.settings import LakeSettings
from outbox_reconcile.evidence import Evidence
from outbox_reconcile.findings import Report, compare
from outbox_reconcile.kafka_reader import read_kafka
from outbox_reconcile.lake_reader import read_lake
from outbox_reconcile.outbox_reader import read_outbox
from outbox_reconcile.records import Window
from outbox_reconcile.settings import ReconcileSettings

__all__ = ["LakeNotFoundError", "Phases", "Sources", "run_reconcile"]


class LakeNotFoundError(ConfigurationError):
    """Kafka has events but the lake root holds no events table: a wrong root, most likely."""


Phases = Callable[[str], Callable[[int], None]]
"""``phases(name)`` announces a phase and returns the function that advances it by n items."""


@dataclass(frozen=True)
class Sources:
    database_url: str
    tables: OutboxTables
    kafka: KafkaSettings | str
    """The cluster and how to reach it (``OUTBOX_KAFKA_*``); a plain ``host:port`` list is a
    cluster without security."""
    lake: LakeSettings


def _quiet(_: str) -> Callable[[int], None]:
    return lambda _: None


def run_reconcile(
    sources: Sources,
    settings: ReconcileSettings,
    window: Window,
    phases: Phases = _quiet,
) -> Report:
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="outbox-reconcile-", dir=settings.work_dir) as work:
        evidence = Evidence(Path(work) / "evidence.sqlite", cache_mb=settings.cache_mb)
        try:
            slots = read_outbox(
                sources.database_url,
                sources.tables,
                evidence,
                window,
                phases("outbox rows and dead letters"),
            )
            kafka = read_kafka(
                sources.kafka,
                sources.lake.topic_pattern,
                evidence,
                window,
                stall_seconds=settings.stall_seconds,
                advance=phases("Kafka records"),
            )
            lake = read_lake(sources.lake, evidence, window, kafka.ranges, phases("lake rows"))
            if lake.events_version is None and kafka.records:
                raise LakeNotFoundError(
                    f"there is no events table at {sources.lake.table_uri('events')} though "
                    f"Kafka holds {kafka.records:,} records: check OUTBOX_LAKE_ROOT (or run "
                    "`outbox lake ingest` first)"
                )
            phases("comparing")
            report = compare(
                evidence,
                window=window.describe(),
                stuck_after_seconds=settings.stuck_after_seconds,
                examples=settings.examples,
            )
        finally:
            evidence.close()
    report.slots = slots
    report.figures["lake_events_version"] = (
        -1 if lake.events_version is None else lake.events_version
    )
    report.figures["seconds"] = round(time.monotonic() - started)
    return report
