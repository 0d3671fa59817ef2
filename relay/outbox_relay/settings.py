"""Settings of the polling relay, from ``OUTBOX_RELAY_*`` environment variables.

The database URL (``OUTBOX_DATABASE_URL``), the outbox's names (``OUTBOX_SCHEMA_NAME``, ...)
and the Kafka cluster (``OUTBOX_KAFKA_BOOTSTRAP_SERVERS``) are the SDK's settings, shared
with every component. See docs/operations.md, "The polling relay".
"""

from __future__ import annotations

import re
from enum import StrEnum

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

__all__ = ["RelayMode", "RelaySettings"]

_TOPIC = re.compile(r"[A-Za-z0-9._-]{1,249}")


class RelayMode(StrEnum):
    """``polling``: the relay is the only path. ``auto``: CDC is primary, the relay the fallback.
    ``cleanup``: CDC is the only path; the relay only deletes the rows CDC delivered (it reads
    them back from Kafka), so a CDC-only outbox does not grow without bound."""

    POLLING = "polling"
    AUTO = "auto"
    CLEANUP = "cleanup"


class RelaySettings(BaseSettings):
    """How the relay reads, publishes, hands over and reports.

    ``OUTBOX_RELAY_MODE``: ``polling``, ``auto`` or ``cleanup``. ``OUTBOX_RELAY_BATCH_SIZE``:
    rows per read. ``OUTBOX_RELAY_IDLE_SECONDS``: pause after a read that found nothing to
    publish. ``OUTBOX_RELAY_GRACE_SECONDS`` (auto): how long a row may wait for CDC before the
    relay publishes it itself. ``OUTBOX_RELAY_CDC_HEARTBEAT_TOPIC`` (auto): the topic of the
    connector's heartbeat change events, proof that CDC streams again; by default the one the
    connector writes (:func:`outbox.core.tables.cdc_heartbeat_topic` of
    ``OUTBOX_CONNECT_TOPIC_PREFIX`` and the outbox's names): set it only for a connector
    configured otherwise.
    ``OUTBOX_RELAY_LEADER_RETRY_SECONDS``: how often a standby replica tries to become leader.
    ``OUTBOX_RELAY_LEASE_SECONDS``: how long leadership lasts without renewal (the leader
    renews every third): a leader cut off from PostgreSQL is replaced within this plus the
    retry interval. ``OUTBOX_RELAY_HTTP_HOST`` / ``OUTBOX_RELAY_HTTP_PORT``: where
    ``/healthz``, ``/readyz`` and ``/metrics`` listen (port 0: no server). Producer:
    ``OUTBOX_RELAY_MAX_REQUEST_BYTES`` (a bigger record is a dead letter),
    ``OUTBOX_RELAY_LINGER_MS``, ``OUTBOX_RELAY_DELIVERY_TIMEOUT_SECONDS`` (a batch not
    acknowledged by then is retried), ``OUTBOX_RELAY_RETRY_BACKOFF_SECONDS`` (first pause
    after a failure, doubled up to ``OUTBOX_RELAY_MAX_BACKOFF_SECONDS``; also the pause of an
    aggregate the broker refused for a reason that can pass).
    ``OUTBOX_RELAY_DATABASE_PASSWORD``: the password ``outbox db relay-role`` sets.
    """

    model_config = SettingsConfigDict(env_prefix="OUTBOX_RELAY_", extra="ignore", frozen=True)

    mode: RelayMode = RelayMode.POLLING
    batch_size: int = Field(default=5000, ge=1, le=100_000)
    idle_seconds: float = Field(default=0.1, gt=0, le=60)
    grace_seconds: float = Field(default=5.0, gt=0, le=3600)
    cdc_heartbeat_topic: str | None = None
    leader_retry_seconds: float = Field(default=1.0, gt=0, le=60)
    lease_seconds: float = Field(default=10.0, ge=2, le=600)
    http_host: str = "127.0.0.1"
    http_port: int = Field(default=8090, ge=0, le=65535)
    max_request_bytes: int = Field(default=1_048_576, ge=1024)
    linger_ms: int = Field(default=5, ge=0, le=1000)
    delivery_timeout_seconds: float = Field(default=30.0, ge=3, le=3600)
    retry_backoff_seconds: float = Field(default=0.5, gt=0, le=60)
    max_backoff_seconds: float = Field(default=10.0, gt=0, le=600)
    database_password: SecretStr = SecretStr("")
    """Only for ``outbox db relay-role``: the password it gives the relay's role."""

    @field_validator("cdc_heartbeat_topic")
    @classmethod
    def _topic_name(cls, value: str | None) -> str | None:
        if value is not None and not _TOPIC.fullmatch(value):
            raise ValueError(
                f"{value!r} is not a Kafka topic name: letters, digits, '.', '_' and '-' only"
            )
        return value
