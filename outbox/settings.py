"""Typed settings of the SDK, read from ``OUTBOX_*`` environment variables.

Every component has one settings class; a bad value fails at start-up with a message that
names the variable (see :func:`describe_validation_error`).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated, Literal

from pydantic import Field, SecretStr, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from outbox.core.errors import ConfigurationError
from outbox.core.identifiers import validate_identifier
from outbox.core.tables import OutboxTables

__all__ = [
    "DatabaseSettings",
    "KafkaSettings",
    "OutboxSettings",
    "describe_validation_error",
    "effect_retention",
]

PositiveDuration = Annotated[timedelta, Field(gt=timedelta(0))]


class OutboxSettings(BaseSettings):
    """Where the outbox lives and the limits of what it accepts (``OUTBOX_*``).

    Read by the SDK, the CLI, the relay, the connector's rendering and reconcile. Names are
    plain SQL identifiers; durations accept seconds (``86400``) or ISO 8601 (``P1D``). A
    *done* step of the side-effect ledger is kept for :attr:`effect_retention`, derived from
    the inbox and dead-letter retentions (the longer), so that a redelivery or a dead
    letter's replay, however late, finds it done and does not call the third party again.
    Each field's docstring is its meaning in docs/settings.md (generated from this class).
    """

    model_config = SettingsConfigDict(
        env_prefix="OUTBOX_", extra="ignore", frozen=True, use_attribute_docstrings=True
    )

    schema_name: str = "outbox"
    """Schema of the outbox objects (tables, sequence, publication's tables)."""
    table: str = "outbox"
    """The outbox table."""
    dedup_table: str = "outbox_dedup"
    """The dedup keys' table."""
    inbox_table: str = "outbox_inbox"
    """The inbox claims' table (idempotent consumers)."""
    publication: str = "outbox_publication"
    """The publication CDC reads (made by the migrations, inserts only)."""
    max_payload_bytes: int = Field(default=1_000_000, gt=0, le=100_000_000)
    """Largest JSON payload of one event, in bytes (larger: PayloadTooLargeError)."""
    dedup_window: PositiveDuration = timedelta(hours=24)
    """How long a dedup key makes a second publish a no-op (`outbox db expire` deletes older
    keys)."""
    inbox_retention: PositiveDuration = timedelta(days=7)
    """How long an inbox claim is kept: longer than any redelivery can take."""
    dead_letter_retention: PositiveDuration = timedelta(days=30)
    """How long a consumer dead letter is kept (`outbox db expire`; relay dead letters are
    never expired). Done side-effect steps live as long as this or the inbox retention,
    whichever is longer."""
    lake_contract: Literal["off", "warn", "strict"] = "warn"
    """What publishing does with a payload the lake's typed table would set aside: `warn`
    (a LakeContractWarning), `strict` (refuse it: LakeContractError) or `off`."""
    lake_strict_types: frozenset[str] = frozenset()
    """Aggregate types held to `strict` whatever the mode, as a JSON list (`["order"]`)."""

    @field_validator("schema_name", "table", "dedup_table", "inbox_table", "publication")
    @classmethod
    def _plain_identifier(cls, value: str) -> str:
        return validate_identifier(value, field="the name")

    @field_validator("dedup_window", "inbox_retention", "dead_letter_retention", mode="before")
    @classmethod
    def _seconds_or_iso(cls, value: object) -> object:
        """Environment values are text: accept '86400' (seconds) as well as 'P1D'."""
        if isinstance(value, str):
            try:
                return timedelta(seconds=float(value))
            except ValueError:
                return value
        return value

    @property
    def effect_retention(self) -> timedelta:
        """How long a *done* ledger step is kept: as long as inbox claims and dead letters."""
        return effect_retention(self.inbox_retention, self.dead_letter_retention)

    @property
    def tables(self) -> OutboxTables:
        return OutboxTables(
            schema=self.schema_name,
            outbox=self.table,
            dedup=self.dedup_table,
            inbox=self.inbox_table,
            publication=self.publication,
        )


def effect_retention(inbox_retention: timedelta, dead_letter_retention: timedelta) -> timedelta:
    """A done step outlives what can bring its event back: an expired inbox claim (the event
    is applied again) or a dead letter (replayed). Never a setting of its own to disagree."""
    return max(inbox_retention, dead_letter_retention)


class DatabaseSettings(BaseSettings):
    """``OUTBOX_DATABASE_URL``: the SQLAlchemy URL of the application's database.

    For example ``postgresql+psycopg://app:secret@db.internal:5432/shop``. It is a secret: it
    is never logged or printed with its password. A plain ``postgresql://`` URL is given the
    psycopg 3 driver (:func:`outbox.sqlalchemy_url`); another driver is refused.
    """

    # hide_input_in_errors: a refused URL is not repeated (with its password) in the error.
    model_config = SettingsConfigDict(
        env_prefix="OUTBOX_",
        extra="ignore",
        frozen=True,
        hide_input_in_errors=True,
        use_attribute_docstrings=True,
    )

    database_url: SecretStr
    """SQLAlchemy URL of the database (`postgresql+psycopg://user:password@host:5432/db`;
    `postgresql://` gets the psycopg 3 driver). A secret: never printed. The CLI's
    `outbox db` and `outbox effects` also take `--database-url-file PATH`."""

    @field_validator("database_url")
    @classmethod
    def _postgres_url(cls, value: SecretStr) -> SecretStr:
        """On psycopg 3: ``postgresql://`` (psycopg2 to SQLAlchemy) gets its driver."""
        from outbox._drivers import sqlalchemy_url

        try:
            return SecretStr(sqlalchemy_url(value.get_secret_value()))
        except ConfigurationError as error:
            raise ValueError(str(error)) from None


class KafkaSettings(BaseSettings):
    """``OUTBOX_KAFKA_BOOTSTRAP_SERVERS``: the Kafka cluster every component uses.

    Unset, the local stack's own broker is used; set, ``outbox stack up`` starts no broker
    and Connect, the relay and the lake job use this cluster instead.
    """

    model_config = SettingsConfigDict(
        env_prefix="OUTBOX_KAFKA_", extra="ignore", frozen=True, use_attribute_docstrings=True
    )

    bootstrap_servers: str | None = None
    """The Kafka cluster, `host:port[,host:port...]`; unset: the local stack's broker."""

    @field_validator("bootstrap_servers")
    @classmethod
    def _host_ports(cls, value: str | None) -> str | None:
        if value is None:
            return None
        servers = [server.strip() for server in value.split(",") if server.strip()]
        for server in servers:
            host, _, port = server.rpartition(":")
            if not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise ValueError(f"{server!r} is not host:port: use e.g. kafka-1:9092,kafka-2:9092")
        return ",".join(servers)


def describe_validation_error(error: ValidationError, *, env_prefix: str = "OUTBOX_") -> str:
    """One line per bad setting, named as its environment variable."""
    lines = []
    for item in error.errors():
        name = "_".join(str(part) for part in item["loc"]).upper()
        lines.append(f"{env_prefix}{name}: {item['msg']}")
    return "invalid settings:\n  " + "\n  ".join(lines)
