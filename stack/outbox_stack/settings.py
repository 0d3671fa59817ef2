"""Settings of the native local stack, from ``OUTBOX_STACK_*`` environment variables."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from outbox.core.identifiers import validate_identifier

__all__ = ["StackSettings"]


class StackSettings(BaseSettings):
    """Where the local stack keeps its files and where its services listen.

    ``OUTBOX_STACK_DIR``: folder for data, logs and downloads (default ``.stack`` in the
    current folder; it is git-ignored). ``OUTBOX_STACK_POSTGRES_PORT``: loopback port of the
    private PostgreSQL. ``OUTBOX_STACK_POSTGRES_DATABASE``: the database it creates.
    ``OUTBOX_STACK_POSTGRES_BIN``: PostgreSQL 15's binaries (Debian's ``postgresql-15``).
    ``OUTBOX_STACK_POSTGRES_SERVER_DIR``: where the server keeps data, socket and log (default:
    the stack folder, or a folder of the ``postgres`` user when run as root from a folder it
    cannot reach; see :mod:`outbox_stack.server_home`); a folder of its own: as root it is given to
    the ``postgres`` user.
    ``OUTBOX_STACK_DOWNLOADS``: cache of the jars fetched from Maven Central (and Maven's own
    repository, ``m2/``).
    ``OUTBOX_STACK_BROKER_PORT``: loopback port of the broker's client listener (Apache Kafka);
    ``OUTBOX_STACK_BROKER_CONTROLLER_PORT``: loopback port of its KRaft controller listener;
    ``OUTBOX_STACK_BROKER_HEAP``: its Java heap (``-Xmx``), e.g. ``512m`` or ``1g``.
    ``OUTBOX_STACK_CONNECT_PORT``: REST port of the Kafka Connect worker;
    ``OUTBOX_STACK_CONNECT_HEAP``: its Java heap (``-Xmx``), e.g. ``768m`` or ``1g``.
    """

    model_config = SettingsConfigDict(env_prefix="OUTBOX_STACK_", extra="ignore", frozen=True)

    dir: Path = Path(".stack")
    postgres_port: int = Field(default=54329, ge=1024, le=65535)
    postgres_database: str = "outbox"
    postgres_bin: Path = Path("/usr/lib/postgresql/15/bin")
    postgres_server_dir: Path | None = None
    postgres_start_timeout_seconds: float = Field(default=60.0, gt=0)
    downloads: Path = Path(".cache/stack")
    broker_port: int = Field(default=59092, ge=1024, le=65535)
    broker_controller_port: int = Field(default=59093, ge=1024, le=65535)
    broker_heap: str = Field(default="512m", pattern=r"^[1-9][0-9]*[mg]$")
    broker_start_timeout_seconds: float = Field(default=90.0, gt=0)
    connect_port: int = Field(default=58083, ge=1024, le=65535)
    connect_heap: str = Field(default="768m", pattern=r"^[1-9][0-9]*[mg]$")
    connect_start_timeout_seconds: float = Field(default=180.0, gt=0)
    java: Path = Path("java")

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
    def downloads_root(self) -> Path:
        return self.downloads.resolve()

    @property
    def bootstrap_servers(self) -> str:
        return f"127.0.0.1:{self.broker_port}"
