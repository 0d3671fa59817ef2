"""Settings of the native local stack, from ``OUTBOX_STACK_*`` environment variables."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from outbox.core.identifiers import validate_identifier

__all__ = ["StackSettings", "forget_stack", "remember_stack", "remembered_stack"]

DEFAULT_DIR = Path(".stack")


def _pointer() -> Path:
    """The file that names the stack last started (for commands run from another folder)."""
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "outbox" / "stack-dir"


def remembered_stack() -> tuple[Path, Path] | None:
    """The folder of the stack ``outbox stack up`` last started (if it still exists) and
    its downloads folder."""
    try:
        lines = _pointer().read_text().splitlines()
    except (OSError, RuntimeError):  # no pointer, or no home folder
        return None
    if len(lines) != 2:
        return None
    found, downloads = Path(lines[0]), Path(lines[1])
    if not found.is_absolute() or not (found / "postgres").exists():
        return None
    return found, downloads


def remember_stack(settings: StackSettings) -> Path | None:
    """Name this stack as the one to find from any folder; the pointer file, or None when it
    cannot be written (a read-only home: commands then look in the current folder only)."""
    try:
        pointer = _pointer()
        pointer.parent.mkdir(parents=True, exist_ok=True)
        pointer.write_text(f"{settings.root}\n{settings.downloads_root}\n")
    except (OSError, RuntimeError):
        return None
    return pointer


def forget_stack(settings: StackSettings) -> None:
    """Forget this stack (deleted) if it is the one remembered."""
    with contextlib.suppress(OSError, RuntimeError):
        remembered = remembered_stack()
        if remembered is None or remembered[0] == settings.root:
            _pointer().unlink()


class StackSettings(BaseSettings):
    """Where the local stack keeps its files and where its services listen
    (``OUTBOX_STACK_*``). Each field's docstring is its meaning in docs/settings.md.
    """

    model_config = SettingsConfigDict(
        env_prefix="OUTBOX_STACK_", extra="ignore", frozen=True, use_attribute_docstrings=True
    )

    dir: Path = Path(".stack")
    """Data, logs, pid files and generated secrets. Unset: `.stack` in the current folder
    when there is one, else the stack `outbox stack up` (or `outbox demo`) last started,
    from any folder (its path is kept in `$XDG_STATE_HOME/outbox/stack-dir`, by default
    `~/.local/state/outbox/stack-dir`), else `.stack` here."""
    postgres_port: int = Field(default=54329, ge=1024, le=65535)
    """Loopback port of the private PostgreSQL."""
    postgres_database: str = "outbox"
    """The database `up` creates."""
    postgres_bin: Path = Path("/usr/lib/postgresql/15/bin")
    """PostgreSQL 15's binaries (Debian's `postgresql-15`)."""
    postgres_server_dir: Path | None = None
    """Where the server keeps data, socket and log (default: the stack folder, or as root a
    folder of the `postgres` user when it cannot reach the stack folder); a folder of its
    own."""
    postgres_start_timeout_seconds: float = Field(default=60.0, gt=0)
    """How long `up` waits for PostgreSQL to answer."""
    downloads: Path = Path(".cache/stack")
    """Jars fetched from Maven Central, and Maven's own repository (`m2/`). Unset, with the
    stack found from another folder: `.cache/stack` beside that stack's folder."""
    broker_port: int = Field(default=59092, ge=1024, le=65535)
    """Loopback port of the broker's client listener (Apache Kafka)."""
    broker_controller_port: int = Field(default=59093, ge=1024, le=65535)
    """Loopback port of the broker's KRaft controller listener."""
    broker_heap: str = Field(default="512m", pattern=r"^[1-9][0-9]*[mg]$")
    """The broker's Java heap (`-Xms`/`-Xmx`), e.g. `512m` or `1g`."""
    broker_start_timeout_seconds: float = Field(default=90.0, gt=0)
    """How long `up` waits for the broker."""
    connect_port: int = Field(default=58083, ge=1024, le=65535)
    """REST port of the Kafka Connect worker."""
    relay_port: int = Field(default=58090, ge=1024, le=65535)
    """Loopback port of the health and metrics endpoint of the relay `outbox demo` leaves
    running (auto mode: it deletes the rows CDC delivered, and publishes when CDC stops)."""
    connect_heap: str = Field(default="768m", pattern=r"^[1-9][0-9]*[mg]$")
    """Connect's Java heap (`-Xms`/`-Xmx`), e.g. `768m` or `1g`."""
    connect_start_timeout_seconds: float = Field(default=180.0, gt=0)
    """How long `up` waits for Kafka Connect."""
    java: Path = Path("java")
    """The Java 17 runtime."""
    object_store: bool = False
    """Also start SeaweedFS, an S3-compatible store on loopback with a `lake` bucket: `outbox
    stack env` then points the lake at `s3://lake/outbox` (the AWS variables with it)."""
    object_store_port: int = Field(default=22333, ge=1024, le=55530)
    """S3 port of the object store; the next four and each of the five plus 10000 are its
    other listeners (all on loopback)."""
    object_store_start_timeout_seconds: float = Field(default=60.0, gt=0)
    """How long `up` waits for the object store."""
    tracing: bool = False
    """Also start Jaeger (all-in-one, spans in memory, every listener on loopback; built
    once from source with Go into the downloads folder): `outbox stack env` then exports
    the OpenTelemetry variables that send spans to it, and its UI is at
    `http://127.0.0.1:<tracing_port>`."""
    tracing_port: int = Field(default=16686, ge=1024, le=65532)
    """Loopback port of Jaeger's UI and query API; the next three are its OTLP/HTTP receiver
    (`OTEL_EXPORTER_OTLP_ENDPOINT`), its query gRPC and its health check."""

    @model_validator(mode="before")
    @classmethod
    def _the_stack_last_started(cls, data: Any) -> Any:
        """Unset ``dir``: ``.stack`` here if it exists, else the stack last started."""
        if not isinstance(data, dict) or data.get("dir") is not None or DEFAULT_DIR.exists():
            return data
        remembered = remembered_stack()
        if remembered is None:
            return data
        found, downloads = remembered
        return {**data, "dir": found, "downloads": data.get("downloads") or downloads}

    @field_validator("postgres_database")
    @classmethod
    def _plain_identifier(cls, value: str) -> str:
        return validate_identifier(value, field="the database name")

    @model_validator(mode="after")
    def _distinct_ports(self) -> StackSettings:
        ports = {
            "OUTBOX_STACK_POSTGRES_PORT": self.postgres_port,
            "OUTBOX_STACK_BROKER_PORT": self.broker_port,
            "OUTBOX_STACK_BROKER_CONTROLLER_PORT": self.broker_controller_port,
            "OUTBOX_STACK_CONNECT_PORT": self.connect_port,
            "OUTBOX_STACK_RELAY_PORT": self.relay_port,
            **({"OUTBOX_STACK_TRACING_PORT": self.tracing_port} if self.tracing else {}),
        }
        seen: dict[int, str] = {}
        for name, port in ports.items():
            if port in seen:
                raise ValueError(f"{name} and {seen[port]} are both {port}: give each its own")
            seen[port] = name
        return self

    @property
    def root(self) -> Path:
        return self.dir.resolve()

    @property
    def lake_root(self) -> Path:
        """The local lake: `.lake` beside the stack's folder (the checkout's `.lake` for the
        default `.stack`), unless OUTBOX_LAKE_ROOT says otherwise."""
        return self.root.parent / ".lake"

    @property
    def downloads_root(self) -> Path:
        return self.downloads.resolve()

    @property
    def bootstrap_servers(self) -> str:
        return f"127.0.0.1:{self.broker_port}"
