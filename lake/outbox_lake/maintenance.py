"""``outbox lake maintain``: compact the small files a stream writes, then vacuum old ones.

On a local folder, safe beside a running ingest: compaction is a Delta commit like any other,
and both writers (Spark's and ``deltalake``) commit a version by creating its file only if
it is absent, so of two racing commits one fails and retries (the job's appends are blind
appends, which Delta rebases over a compaction; compaction changes no data, and the typed
query's Delta source skips it); vacuum only deletes files that left the table longer
ago than the retention (7 days by default), so no running reader loses a file it still uses.

On object storage, not beside a running ingest: Spark's Delta writer commits through S3A
without a conditional write (Delta's S3SingleDriverLogStore is safe for one writing driver
only), so a compaction committed by ``deltalake`` between its check and its write would be
overwritten, and ``deltalake``'s checkpoint of that version would then describe a log that
is not there: readers would miss the batch's rows. ``maintain`` on an ``s3://`` root so runs
only when told the job is stopped (``ingest_stopped``), and refuses otherwise, naming the
rule (docs/production.md, "The lake on object storage").
"""

from __future__ import annotations

from dataclasses import dataclass

from outbox.core.errors import ConfigurationError
from outbox_lake.settings import LakeSettings
from outbox_lake.storage import open_table, table_names

__all__ = ["MaintenanceReport", "maintain", "must_wait_for_the_job"]


def must_wait_for_the_job(settings: LakeSettings, *, ingest_stopped: bool) -> bool:
    """Whether compaction would race the ingest job's unconditional commits (an object
    store root) while the job may be running."""
    return not settings.is_local and not ingest_stopped


@dataclass(frozen=True)
class MaintenanceReport:
    table: str
    files_removed: int
    files_added: int
    vacuumed: int


def maintain(
    settings: LakeSettings, *, retention_hours: int = 168, ingest_stopped: bool = False
) -> list[MaintenanceReport]:
    """Compact and vacuum every table (files removed longer ago than ``retention_hours``,
    and files no commit names, at least an hour old beside a running job); on object
    storage only with ``ingest_stopped``."""
    if must_wait_for_the_job(settings, ingest_stopped=ingest_stopped):
        raise ConfigurationError(
            f"OUTBOX_LAKE_ROOT={settings.root} is on object storage, where Spark's Delta "
            "writer is safe only as the one writer of its tables: stop the lake's ingest job "
            "first (SIGTERM: it finishes its batch), then run `outbox lake maintain "
            "--ingest-stopped`, then start the job again"
        )
    reports = []
    for name in table_names(settings):
        table = open_table(settings, settings.table_uri(name))
        if table is None:
            continue
        metrics = table.optimize.compact()
        # full: also the files no commit names (a write whose commit never came: the job
        # killed between the two); beside a running job never one younger than an hour,
        # which may be a write about to be committed
        kept_hours = retention_hours if ingest_stopped else max(retention_hours, 1)
        vacuumed = table.vacuum(
            retention_hours=kept_hours,
            dry_run=False,
            enforce_retention_duration=kept_hours >= 168,
            full=True,
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
