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
    """How `outbox reconcile` judges and what it keeps (``OUTBOX_RECONCILE_*``); each field's
    docstring is its meaning in docs/settings.md."""

    model_config = SettingsConfigDict(
        env_prefix="OUTBOX_RECONCILE_", extra="ignore", frozen=True, use_attribute_docstrings=True
    )

    stuck_after_seconds: float = Field(default=300.0, gt=0, le=30 * 86400)
    """An outbox row older than this whose event is not on Kafka is stuck (younger: in flight).
    """
    stall_seconds: float = Field(default=60.0, gt=0, le=3600)
    """A partition whose read does not move for this long before its end stops the run with an
    error naming it (never a report of a partial read)."""
    examples: int = Field(default=20, ge=0, le=10_000)
    """Examples kept per finding and aggregate type."""
    work_dir: str | None = None
    """Where the on-disk evidence file goes (unset: the system's temporary folder; about 700
    bytes per event, deleted at the end)."""
    cache_mb: int = Field(default=64, ge=4, le=65536)
    """SQLite's page cache, the bulk of reconcile's memory."""
