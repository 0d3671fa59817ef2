"""Settings of the operators' web console, from ``OUTBOX_CONSOLE_*`` environment variables.

The database, Kafka, the connector and the lake are the other components' own settings
(``OUTBOX_DATABASE_URL``, ``OUTBOX_KAFKA_*``, ``OUTBOX_CONNECT_*``, ``OUTBOX_LAKE_*``): the
console reads what they read. See docs/operations.md, "The console".
"""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

__all__ = ["ConsoleSettings", "is_loopback"]


def is_loopback(host: str) -> bool:
    """Whether ``host`` is a loopback address (127.0.0.0/8, ::1) or ``localhost``."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class ConsoleSettings(BaseSettings):
    """Where the console listens, who may use it, what it may do, and where it reads the
    relay's, the lake job's and reconcile's figures (``OUTBOX_CONSOLE_*``). Each field's
    docstring is its meaning in docs/settings.md."""

    model_config = SettingsConfigDict(
        env_prefix="OUTBOX_CONSOLE_", extra="ignore", frozen=True, use_attribute_docstrings=True
    )

    host: str = Field(default="127.0.0.1", pattern=r"^[A-Za-z0-9.:\[\]-]{1,253}$")
    """Address the console listens on. Anything but loopback needs
    `OUTBOX_CONSOLE_TOKEN_FILE`; put TLS in front of it (a reverse proxy)."""
    port: int = Field(default=58088, ge=1, le=65535)
    """Port the console listens on."""
    token_file: Path | None = None
    """A file holding the console's token (one line, 16 characters or more): every request
    must then carry it (`Authorization: Bearer`, or the login form's cookie). Required when
    `OUTBOX_CONSOLE_HOST` is not loopback. The token itself is never taken from the
    environment or the command line."""
    allow_actions: bool = False
    """Show and accept the actions: replay and discard dead letters. Off: read-only."""
    relay_urls: Annotated[list[str], NoDecode] = ["http://127.0.0.1:58090"]
    """The relays' health endpoints (`OUTBOX_RELAY_HTTP_PORT`), comma-separated: one per
    replica. The default is the local stack's relay."""
    lake_metrics_url: str | None = None
    """The lake job's metrics endpoint (`OUTBOX_LAKE_METRICS_PORT`), e.g.
    `http://127.0.0.1:9464`: its last batch and lag per partition. Unset: only what the
    lake's tables say."""
    reconcile_metrics_file: Path | None = None
    """The file `outbox reconcile --metrics-file` writes: the last run's findings. Unset:
    the panel says how to set it up."""
    refresh_seconds: float = Field(default=2.0, ge=0.5, le=60)
    """How often the overview refreshes, and each component is read again."""
    answer_seconds: float = Field(default=3.0, gt=0, le=60)
    """How long a component may take to answer before it shows as "no answer in N s"."""
    trace_seconds: float = Field(default=20.0, gt=0, le=300)
    """How long the event page waits for an event's lineage (`outbox trace`)."""

    @field_validator("relay_urls", mode="before")
    @classmethod
    def _comma_separated(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [url.strip() for url in value.split(",") if url.strip()]
        return value

    @field_validator("relay_urls", "lake_metrics_url")
    @classmethod
    def _http_urls(cls, value: Any) -> Any:
        for url in value if isinstance(value, list) else [value]:
            if url is not None and not url.startswith(("http://", "https://")):
                raise ValueError(f"{url!r} is not an http:// or https:// URL")
        return value

    @model_validator(mode="after")
    def _a_token_off_loopback(self) -> ConsoleSettings:
        if self.token_file is None and not is_loopback(self.host):
            raise ValueError(
                f"OUTBOX_CONSOLE_HOST={self.host} is not a loopback address, and "
                "OUTBOX_CONSOLE_TOKEN_FILE is not set: anyone who reaches the port would see "
                "the pipeline. Set OUTBOX_CONSOLE_TOKEN_FILE to a file holding a token (e.g. "
                "`head -c 32 /dev/urandom | base64 > console.token; chmod 600 console.token`), "
                "or listen on 127.0.0.1"
            )
        return self
