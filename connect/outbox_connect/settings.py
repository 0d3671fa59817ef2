"""Settings of the CDC connector, from ``OUTBOX_CONNECT_*`` environment variables."""

from __future__ import annotations

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from outbox.core.identifiers import validate_identifier
from outbox.core.tables import DEFAULT_CDC_TOPIC_PREFIX

__all__ = ["ConnectorSettings"]


class ConnectorSettings(BaseSettings):
    """Where Kafka Connect is, and how the connector reaches PostgreSQL.

    ``OUTBOX_CONNECT_URL``: Connect's REST API. ``OUTBOX_CONNECT_NAME``: the connector's name.
    ``OUTBOX_CONNECT_DATABASE_*``: host, port, database, user and password the connector
    uses; the user should be the CDC role (``outbox db cdc-role``), never a superuser.
    ``OUTBOX_CONNECT_SLOT_NAME``: the replication slot. ``OUTBOX_CONNECT_TOPIC_PREFIX``:
    Debezium's logical server name (it names the heartbeat topic).
    """

    model_config = SettingsConfigDict(env_prefix="OUTBOX_CONNECT_", extra="ignore", frozen=True)

    url: str = "http://127.0.0.1:58083"
    name: str = Field(default="outbox-connector", pattern=r"^[A-Za-z0-9._-]{1,100}$")
    database_host: str = "127.0.0.1"
    database_port: int = Field(default=54329, ge=1, le=65535)
    database_name: str = "outbox"
    database_user: str = "outbox_cdc"
    # Read by the Connect worker from its environment, never sent through the REST API.
    database_password: SecretStr = SecretStr("")
    slot_name: str = "outbox_slot"
    topic_prefix: str = Field(default=DEFAULT_CDC_TOPIC_PREFIX, pattern=r"^[A-Za-z0-9._-]{1,100}$")
    heartbeat_interval_ms: int = Field(default=10_000, ge=100, le=3_600_000)

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
