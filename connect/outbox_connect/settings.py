"""Settings of the CDC connector, from ``OUTBOX_CONNECT_*`` environment variables."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from outbox.core.identifiers import validate_identifier
from outbox.core.tables import DEFAULT_CDC_TOPIC_PREFIX

__all__ = ["ConnectorSettings", "SslMode"]

SslMode = Literal["disable", "allow", "prefer", "require", "verify-ca", "verify-full"]
"""Debezium's ``database.sslmode`` (PostgreSQL's JDBC driver's, as libpq's)."""


class ConnectorSettings(BaseSettings):
    """Where Kafka Connect is, and how the connector reaches PostgreSQL
    (``OUTBOX_CONNECT_*``): they fill the ``{{name}}`` placeholders of
    ``outbox-connector.json``. The user should be the CDC role (``outbox db cdc-role``),
    never a superuser. Each field's docstring is its meaning in docs/settings.md.
    """

    model_config = SettingsConfigDict(
        env_prefix="OUTBOX_CONNECT_", extra="ignore", frozen=True, use_attribute_docstrings=True
    )

    url: str = "http://127.0.0.1:58083"
    """Kafka Connect's REST API."""
    name: str = Field(default="outbox-connector", pattern=r"^[A-Za-z0-9._-]{1,100}$")
    """The connector's name."""
    database_host: str = "127.0.0.1"
    """Where the connector (in Connect's worker) finds PostgreSQL."""
    database_port: int = Field(default=54329, ge=1, le=65535)
    """PostgreSQL's port, as the connector reaches it."""
    database_name: str = "outbox"
    """The database of the outbox."""
    database_user: str = "outbox_cdc"
    """The CDC role (`outbox db cdc-role` creates it)."""
    database_password: SecretStr = SecretStr("")
    """The CDC role's password: read by the Connect worker from its environment
    (`${env:OUTBOX_CONNECT_DATABASE_PASSWORD}`), never sent through the REST API; also what
    `outbox db cdc-role` sets."""
    slot_name: str = "outbox_slot"
    """The replication slot."""
    topic_prefix: str = Field(default=DEFAULT_CDC_TOPIC_PREFIX, pattern=r"^[A-Za-z0-9._-]{1,100}$")
    """Debezium's logical server name: it names the heartbeat topic."""
    offsets_topic: str = Field(default="outbox-connect-offsets", pattern=r"^[A-Za-z0-9._-]{1,249}$")
    """Connect's offsets topic (the workers' `offset.storage.topic`): `outbox connect status`
    reports transactions left open on it, and `outbox connect unblock` aborts the hanging
    ones, which hold an exactly-once worker at start-up."""
    heartbeat_interval_ms: int = Field(default=10_000, ge=100, le=3_600_000)
    """Heartbeat period: keeps the slot moving while the outbox is idle."""
    database_sslmode: SslMode | None = None
    """Debezium's `database.sslmode`: `verify-full` verifies the server's certificate and its
    host name. Unset, it is left out of the connector's configuration (Debezium's default,
    `prefer`: TLS when the server offers it, unverified)."""
    database_sslrootcert: str | None = None
    """Debezium's `database.sslrootcert`: the CA file (PEM), an absolute path on Connect's
    hosts; needs `verify-ca` or `verify-full`."""

    @field_validator("database_name", "database_user", "slot_name")
    @classmethod
    def _plain_identifier(cls, value: str) -> str:
        return validate_identifier(value, field="the name")

    @field_validator("url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError("must be an http(s) URL such as http://connect:8083")
        return value.rstrip("/")

    @field_validator("database_sslrootcert")
    @classmethod
    def _absolute_path(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith("/"):
            raise ValueError(
                "must be the absolute path of the CA file (PEM) on Connect's hosts, such as "
                "/etc/outbox/postgres-ca.crt"
            )
        return value

    @model_validator(mode="after")
    def _ca_file_needs_verification(self) -> ConnectorSettings:
        if self.database_sslrootcert is not None and self.database_sslmode not in (
            "verify-ca",
            "verify-full",
        ):
            raise ValueError(
                "OUTBOX_CONNECT_DATABASE_SSLROOTCERT is read only when the server's certificate "
                "is verified: set OUTBOX_CONNECT_DATABASE_SSLMODE=verify-full too"
            )
        return self
