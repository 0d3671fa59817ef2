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
    """How the relay reads, publishes, hands over and reports (``OUTBOX_RELAY_*``).

    The database URL (``OUTBOX_DATABASE_URL``), the outbox's names and the Kafka cluster are
    the SDK's settings, shared with every component. Each field's docstring is its meaning in
    docs/settings.md (generated from this class).
    """

    model_config = SettingsConfigDict(
        env_prefix="OUTBOX_RELAY_", extra="ignore", frozen=True, use_attribute_docstrings=True
    )

    mode: RelayMode = RelayMode.POLLING
    """`polling` (the relay is the only path), `auto` (CDC is primary, the relay takes over
    when rows wait longer than the grace period) or `cleanup` (CDC only: the relay deletes
    the rows CDC delivered)."""
    batch_size: int = Field(default=5000, ge=1, le=100_000)
    """Rows per read."""
    idle_seconds: float = Field(default=0.1, gt=0, le=60)
    """Pause after a read that found nothing to publish."""
    grace_seconds: float = Field(default=5.0, gt=0, le=3600)
    """Auto mode: how long a row may wait for CDC before the relay publishes it itself."""
    cdc_heartbeat_topic: str | None = None
    """Auto mode: the connector's heartbeat topic, proof that CDC streams again; unset: the
    one the connector writes (`<OUTBOX_CONNECT_TOPIC_PREFIX>.<schema>.<table>_heartbeat`).
    Set it only for a connector configured otherwise."""
    connect_offsets_topic: str = Field(
        default="outbox-connect-offsets", pattern=r"^([A-Za-z0-9._-]{1,249})?$"
    )
    """Auto mode: Kafka Connect's offsets topic (the workers' `offset.storage.topic`). While
    the relay has taken over, it aborts the *hanging* transactions on it (no coordinator
    counts them open, so Kafka never ends them; they hold an exactly-once worker at start-up,
    so CDC never comes back), as `outbox connect unblock` does: nothing is lost (one whose
    coordinator recorded it committed is re-delivered: duplicates, which the lake and
    idempotent consumers drop). Empty: never (an operator runs `unblock`)."""
    connect_unblock_idle_seconds: float = Field(default=60.0, ge=0, le=3600)
    """Auto mode: how long a hanging transaction's producer must have been silent before the
    relay aborts it (a margin for a coordinator that is just recording a new partition)."""
    leader_retry_seconds: float = Field(default=1.0, gt=0, le=60)
    """How often a replica looks whether the replicas' shares of the outbox's slices changed
    (one joined or ended) and a standby tries to take slices."""
    lease_seconds: float = Field(default=10.0, ge=2, le=600)
    """How long a replica's leases on its slices last without renewal (it renews them every
    third): the slices of a replica cut off from PostgreSQL are taken by the others within
    this plus the retry interval (11 s by default); a killed one's within the retry
    interval."""
    http_host: str = "127.0.0.1"
    """Address of `/healthz`, `/readyz` and `/metrics` (the image listens on `0.0.0.0`)."""
    http_port: int = Field(default=8090, ge=0, le=65535)
    """Port of `/healthz`, `/readyz` and `/metrics` (0: no server)."""
    max_request_bytes: int = Field(default=1_048_576, ge=1024)
    """Producer: largest record request; a bigger record is a dead letter."""
    linger_ms: int = Field(default=5, ge=0, le=1000)
    """Producer: how long records wait to be batched."""
    delivery_timeout_seconds: float = Field(default=30.0, ge=3, le=3600)
    """A batch the broker has not acknowledged by then is published again."""
    retry_backoff_seconds: float = Field(default=0.5, gt=0, le=60)
    """First pause after a failure (doubled up to the maximum); also the pause of an
    aggregate the broker refused for a reason that can pass."""
    max_backoff_seconds: float = Field(default=10.0, gt=0, le=600)
    """Longest pause after repeated failures."""
    database_password: SecretStr = SecretStr("")
    """Only for `outbox db relay-role`: the password it gives the relay's role (never
    printed; `outbox stack env` exports the local stack's)."""

    @field_validator("cdc_heartbeat_topic")
    @classmethod
    def _topic_name(cls, value: str | None) -> str | None:
        if value is not None and not _TOPIC.fullmatch(value):
            raise ValueError(
                f"{value!r} is not a Kafka topic name: letters, digits, '.', '_' and '-' only"
            )
        return value
