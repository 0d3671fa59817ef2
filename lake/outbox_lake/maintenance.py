"""``outbox lake maintain``: compact the small files a stream writes, then vacuum old ones.

Safe beside a running ingest: compaction is a Delta commit like any other (if it races a
batch's commit, one of them retries: the sink retries its batch on a commit conflict, and
its application transaction keeps the retry idempotent); vacuum only deletes files that left
the table longer ago than the retention (7 days by default), so no running reader loses a
file it still uses.
"""

from __future__ import annotations

from dataclasses import dataclass

from outbox_lake.settings import LakeSettings
from outbox_lake.storage import open_table, table_names

__all__ = ["MaintenanceReport", "maintain"]


@dataclass(frozen=True)
class MaintenanceReport:
    table: str
    files_removed: int
    files_added: int
    vacuumed: int


def maintain(settings: LakeSettings, *, retention_hours: int = 168) -> list[MaintenanceReport]:
    reports = []
    for name in table_names(settings):
        table = open_table(settings, settings.table_uri(name))
        if table is None:
            continue
        metrics = table.optimize.compact()
        vacuumed = table.vacuum(
            retention_hours=retention_hours,
            dry_run=False,
            enforce_retention_duration=retention_hours >= 168,
        )
        reports.append(
            MaintenanceReport(
                table=name,
                files_removed=int(metrics.get("numFilesRemoved", 0)),
                files_added=int(metrics.get("numFilesAdded", 0)),
                vacuumed=len(vacuumed),
            )
        )
    return reports
