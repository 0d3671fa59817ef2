"""Settings of the lake job and queries, from ``OUTBOX_LAKE_*`` environment variables."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

__all__ = ["LakeSettings"]


class LakeSettings(BaseSettings):
    """Where the lake lives and how the ingest job reads.

    ``OUTBOX_LAKE_ROOT``: folder (or object-store URI) of the Delta tables; checkpoints live
    beside them in ``_checkpoints``. ``OUTBOX_LAKE_TOPIC_PATTERN``: regex of the topics to
    ingest (new matching topics are picked up without a restart).
    ``OUTBOX_LAKE_MAX_RECORDS_PER_BATCH``: admission control (Spark's
    ``maxOffsetsPerTrigger``), which bounds a batch. ``OUTBOX_LAKE_TRIGGER_SECONDS``:
    micro-batch interval. ``OUTBOX_LAKE_FAIL_ON_DATA_LOSS``: stop when records were deleted by
    retention before they were ingested (``false``: skip them, logged).
    ``OUTBOX_LAKE_SPARK_MASTER``: ``local[2]`` by default, any Spark master URL.
    ``OUTBOX_LAKE_SPARK_JARS``: comma-separated jar files Spark adds (Spark's Kafka source
    and Delta's Spark writer; ``outbox lake ingest`` resolves them when unset);
    ``OUTBOX_LAKE_SPARK_PACKAGES``: Maven coordinates instead (``spark.jars.packages``);
    neither on a cluster that has them (``spark-submit --packages``, ``outbox lake
    packages``). ``OUTBOX_LAKE_SPARK_BIND_ADDRESS``: the address the
    Spark driver listens on and advertises (``127.0.0.1``: loopback only; on a cluster, an
    address the executors can reach). ``OUTBOX_LAKE_METRICS_PORT``: port of the job's
    ``/metrics`` (Prometheus; ``0``, the default: none), on ``OUTBOX_LAKE_METRICS_ADDRESS``
    (``127.0.0.1``; ``0.0.0.0`` in a container).
    """

    model_config = SettingsConfigDict(env_prefix="OUTBOX_LAKE_", extra="ignore", frozen=True)

    root: str = ".lake"
    topic_pattern: str = r"^outbox\.event\..+"
    max_records_per_batch: int = Field(default=50_000, ge=1, le=10_000_000)
    trigger_seconds: float = Field(default=1.0, gt=0, le=3600)
    fail_on_data_loss: bool = True
    spark_master: str = "local[2]"
    spark_bind_address: str = Field(default="127.0.0.1", pattern=r"^[A-Za-z0-9.:-]{1,253}$")
    query_name: str = "outbox-lake-ingest"
    metrics_port: int = Field(default=0, ge=0, le=65535)
    metrics_address: str = Field(default="127.0.0.1", pattern=r"^[A-Za-z0-9.:-]{1,253}$")
    spark_jars: str = ""
    spark_packages: str = ""
    end_offsets: Literal["scan", "broker"] = "scan"
    """Not used by the lake job (Spark's Kafka source reads committed records to the broker's
    end): only ``outbox reconcile``'s Kafka reader (reconcile/outbox_reconcile/kafka_reader.py)
    still reads it, until its own settings take it over."""

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
