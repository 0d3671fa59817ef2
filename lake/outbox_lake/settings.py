"""Settings of the lake job and queries, from ``OUTBOX_LAKE_*`` environment variables, and
the standard AWS variables for a lake on S3-compatible object storage."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import urlsplit

from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

__all__ = ["S3_SCHEMES", "AwsEnvironment", "LakeSettings"]

S3_SCHEMES = ("s3", "s3a")
"""Lake roots on S3-compatible object storage (both are read and written through S3A by
Spark, through ``object_store`` by ``deltalake``)."""


class AwsEnvironment(BaseSettings):
    """The standard AWS variables the lake reads besides the credentials (which only the
    clients read, from the same environment: ``AWS_ACCESS_KEY_ID``,
    ``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``; never passed on by us)."""

    model_config = SettingsConfigDict(
        env_prefix="AWS_", extra="ignore", frozen=True, use_attribute_docstrings=True
    )

    endpoint_url: str | None = None
    """The S3 endpoint (`https://host[:port]`); unset: AWS S3 of the region."""
    region: str | None = None
    """The bucket's region."""
    default_region: str | None = None
    """The region when `AWS_REGION` is unset."""
    allow_http: bool = False
    """Whether an `http://` endpoint may be used (unencrypted: a store on loopback only)."""

    @field_validator("endpoint_url")
    @classmethod
    def _endpoint(cls, value: str | None) -> str | None:
        if not value:
            return None
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(
                f"{value!r} is not an http(s) URL: e.g. https://s3.eu-west-1.amazonaws.com "
                "or http://127.0.0.1:9000"
            )
        if parts.path not in ("", "/") or parts.query:
            raise ValueError(
                f"{value!r} has a path: give the endpoint only (the bucket is in "
                "OUTBOX_LAKE_ROOT, s3://bucket/prefix)"
            )
        return value.rstrip("/")

    @model_validator(mode="after")
    def _http_allowed(self) -> AwsEnvironment:
        if self.endpoint_url and self.endpoint_url.startswith("http://") and not self.allow_http:
            raise ValueError(
                f"AWS_ENDPOINT_URL is {self.endpoint_url}, plain HTTP: data and signed "
                "requests would cross the network unencrypted. Use https, or set "
                "AWS_ALLOW_HTTP=true for a store on loopback or a private network"
            )
        return self

    @property
    def region_name(self) -> str | None:
        return self.region or self.default_region


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
    s3_path_style: bool = False
    """On an `s3://` root: path-style requests (`endpoint/bucket/key`), which most
    S3-compatible stores (SeaweedFS, MinIO, Ceph) need; `false`: virtual-hosted style
    (`bucket.endpoint/key`), as AWS S3 prefers. Endpoint, region and credentials come from
    the standard AWS variables (docs/production.md)."""

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

    @field_validator("root")
    @classmethod
    def _root(cls, value: str) -> str:
        scheme, _, rest = value.partition("://")
        if rest and scheme.lower() in S3_SCHEMES and not rest.split("/", 1)[0]:
            raise ValueError(f"{value!r} names no bucket: e.g. s3://my-bucket/outbox")
        return value

    @model_validator(mode="after")
    def _aws_environment(self) -> LakeSettings:
        if self.is_s3:
            self.aws()  # the AWS variables, checked when the lake needs them
        return self

    def aws(self) -> AwsEnvironment:
        """The AWS variables of the environment (endpoint, region, plain HTTP allowed)."""
        try:
            return AwsEnvironment()
        except ValidationError as error:
            problems = "; ".join(
                (f"AWS_{'_'.join(map(str, item['loc'])).upper()}: " if item["loc"] else "")
                + str(item["msg"]).removeprefix("Value error, ")
                for item in error.errors()
            )
            raise ValueError(f"the lake's object store: {problems}") from None

    @property
    def is_local(self) -> bool:
        return "://" not in self.root

    @property
    def is_s3(self) -> bool:
        return self.root.partition("://")[0].lower() in S3_SCHEMES and "://" in self.root

    def table_uri(self, name: str) -> str:
        if self.is_local:
            return str(Path(self.root).resolve() / name)
        return f"{self.root.rstrip('/')}/{name}"

    @property
    def checkpoint(self) -> str:
        return self.table_uri(f"_checkpoints/{self.query_name}")
