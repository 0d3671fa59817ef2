"""Settings of ``outbox reconcile``, from ``OUTBOX_RECONCILE_*`` environment variables.

The sources reconcile reads are configured where their components are: the outbox
(``OUTBOX_DATABASE_URL``, ``OUTBOX_SCHEMA_NAME``...), Kafka
(``OUTBOX_KAFKA_BOOTSTRAP_SERVERS``) and the lake (``OUTBOX_LAKE_ROOT``,
``OUTBOX_LAKE_TOPIC_PATTERN``).
"""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

__all__ = ["ReconcileSettings"]


class ReconcileSettings(BaseSettings):
    """``OUTBOX_RECONCILE_STUCK_AFTER_SECONDS``: an outbox row older than this whose event is
    not on Kafka is *stuck* (younger: in flight). ``OUTBOX_RECONCILE_STALL_SECONDS``: a
    partition whose read does not move for this long before its end stops the run with an
    error naming it (never a report of a partial read). ``OUTBOX_RECONCILE_EXAMPLES``:
    examples kept per finding and aggregate type. ``OUTBOX_RECONCILE_WORK_DIR``: where the
    on-disk evidence file goes (default: the system's temporary folder; about 700 bytes per
    event, deleted at the end).
    ``OUTBOX_RECONCILE_CACHE_MB``: SQLite's page cache, the bulk of reconcile's memory.
    """

    model_config = SettingsConfigDict(env_prefix="OUTBOX_RECONCILE_", extra="ignore", frozen=True)

    stuck_after_seconds: float = Field(default=300.0, gt=0, le=30 * 86400)
    stall_seconds: float = Field(default=60.0, gt=0, le=3600)
    examples: int = Field(default=20, ge=0, le=10_000)
    work_dir: str | None = None
    cache_mb: int = Field(default=64, ge=4, le=65536)
