"""Settings of the lake job and queries, from ``OUTBOX_LAKE_*`` environment variables."""

from __future__ import annotations

import re
from pathlib import Path

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

__all__ = ["LakeSettings"]


class LakeSettings(BaseSettings):
    """Where the lake lives and how the ingest job reads (``OUTBOX_LAKE_*``); each field's
    docstring is its meaning in docs/settings.md."""

    model_config = SettingsConfigDict(
        env_prefix="OUTBOX_LAKE_", extra="ignore", frozen=True, use_attribute_docstrings=True
    )

    root: str = ".lake"
    """Folder or object-store URI of the Delta tables (checkpoints in `_checkpoints/`)."""
    topic_pattern: str = r"^outbox\.event\..+"
    """Regex of the topics to ingest (new matching topics are picked up without a restart)."""
    max_records_per_batch: int = Field(default=50_000, ge=1, le=10_000_000)
    """Admission control: records per micro-batch at most (Spark's `maxOffsetsPerTrigger`)."""
    trigger_seconds: float = Field(default=1.0, gt=0, le=3600)
    """Micro-batch interval."""
    fail_on_data_loss: bool = True
    """Stop when records not yet ingested are gone (retention, a recreated topic); `false`: go
    on from the earliest offset there is, logged."""
    spark_master: str = "local[2]"
    """Spark master URL (`local[2]`, `spark://host:7077`...)."""
    spark_bind_address: str = Field(default="127.0.0.1", pattern=r"^[A-Za-z0-9.:-]{1,253}$")
    """Address the Spark driver listens on and advertises (loopback; on a cluster, one the
    executors reach)."""
    query_name: str = "outbox-lake-ingest"
    """Names the streaming query, and so its checkpoint."""
    metrics_port: int = Field(default=0, ge=0, le=65535)
    """Port of the job's `/metrics` (0: none)."""
    metrics_address: str = Field(default="127.0.0.1", pattern=r"^[A-Za-z0-9.:-]{1,253}$")
    """Address of the job's `/metrics` (`0.0.0.0` in a container)."""
    spark_jars: str = ""
    """Comma-separated jar files Spark adds (its Kafka source, Delta's Spark writer); unset,
    `outbox lake ingest` resolves them with Maven. Not on a cluster that has them."""
    spark_packages: str = ""
    """Maven coordinates Spark resolves instead (`spark.jars.packages`); `outbox lake packages`
    prints them."""

    @field_validator("topic_pattern")
    @classmethod
    def _regex(cls, value: str) -> str:
        try:
            re.compile(value)
        except re.error as error:
            raise ValueError(
                f"not a regular expression ({error}): e.g. ^outbox\\.event\\..+"
            ) from None
        return value

    @field_validator("query_name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not re.fullmatch(r"[A-Za-z0-9._-]{1,100}", value):
            raise ValueError("letters, digits, '.', '_' and '-' only, e.g. outbox-lake-ingest")
        return value

    @property
    def is_local(self) -> bool:
        return "://" not in self.root

    def table_uri(self, name: str) -> str:
        if self.is_local:
            return str(Path(self.root).resolve() / name)
        return f"{self.root.rstrip('/')}/{name}"

    @property
    def checkpoint(self) -> str:
        return self.table_uri(f"_checkpoints/{self.query_name}")
