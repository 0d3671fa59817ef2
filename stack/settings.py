"""Settings of the native local stack, from ``OUTBOX_STACK_*`` environment variables."""

from __future__ import annotations

from pathlib import Path

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
    """

    model_config = SettingsConfigDict(env_prefix="OUTBOX_STACK_", extra="ignore", frozen=True)

    dir: Path = Path(".stack")
    postgres_port: int = Field(default=54329, ge=1024, le=65535)
    postgres_database: str = "outbox"
    postgres_bin: Path = Path("/usr/lib/postgresql/15/bin")
    postgres_start_timeout_seconds: float = Field(default=60.0, gt=0)

    @field_validator("postgres_database")
    @classmethod
    def _plain_identifier(cls, value: str) -> str:
        return validate_identifier(value, field="the database name")

    @property
    def root(self) -> Path:
        return self.dir.resolve()
