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
    """Where the outbox lives and the limits of what it accepts.

    ``OUTBOX_SCHEMA_NAME``, ``OUTBOX_TABLE``, ``OUTBOX_DEDUP_TABLE``, ``OUTBOX_INBOX_TABLE`` and
    ``OUTBOX_PUBLICATION`` are plain SQL identifiers. ``OUTBOX_MAX_PAYLOAD_BYTES`` bounds one
    event's JSON payload. Durations accept seconds (``86400``) or ISO 8601 (``P1D``).

    Retention: ``OUTBOX_DEDUP_WINDOW`` (a dedup key), ``OUTBOX_INBOX_RETENTION`` (an inbox
    claim), ``OUTBOX_DEAD_LETTER_RETENTION`` (a relay or consumer dead letter). A *done* step
    of the side-effect ledger is kept for :attr:`effect_retention`, derived from the last two
    (the longer), so that a redelivery or a dead letter's replay, however late, finds it done
    and does not call the third party again.

    ``OUTBOX_LAKE_CONTRACT``: what publishing does with a payload the lake's typed table would
    set aside (a field outside int64, names that differ only in case, a reserved name...):
    ``warn`` (default, a :class:`~outbox.LakeContractWarning`), ``strict`` (refuse it with
    :class:`~outbox.LakeContractError`) or ``off``. ``OUTBOX_LAKE_STRICT_TYPES``: aggregate
    types held to ``strict`` whatever the mode, as a JSON list (``["order", "payment"]``).
    """

    model_config = SettingsConfigDict(env_prefix="OUTBOX_", extra="ignore", frozen=True)

    schema_name: str = "outbox"
    table: str = "outbox"
    dedup_table: str = "outbox_dedup"
    inbox_table: str = "outbox_inbox"
    publication: str = "outbox_publication"
    max_payload_bytes: int = Field(default=1_000_000, gt=0, le=100_000_000)
    dedup_window: PositiveDuration = timedelta(hours=24)
    inbox_retention: PositiveDuration = timedelta(days=7)
    dead_letter_retention: PositiveDuration = timedelta(days=30)
    lake_contract: Literal["off", "warn", "strict"] = "warn"
    lake_strict_types: frozenset[str] = frozenset()

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
        env_prefix="OUTBOX_", extra="ignore", frozen=True, hide_input_in_errors=True
    )

    database_url: SecretStr

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

    A comma-separated list of ``host:port``. Unset, the local stack's own broker is used;
    set, ``outbox stack up`` starts no broker and Connect (and later the relay and the lake
    job) use this cluster instead.
    """

    model_config = SettingsConfigDict(env_prefix="OUTBOX_KAFKA_", extra="ignore", frozen=True)

    bootstrap_servers: str | None = None

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
