"""Typed settings of the SDK, read from ``OUTBOX_*`` environment variables.

Every component has one settings class; a bad value fails at start-up with a message that
names the variable (see :func:`describe_validation_error`).
"""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, SecretStr, ValidationError, field_validator, model_validator
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
    "kafka_settings",
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


SecurityProtocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]
SaslMechanism = Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]

_SASL_FIELDS = ("sasl_mechanism", "sasl_username", "sasl_password")
_SSL_FIELDS = ("ssl_cafile", "ssl_certfile", "ssl_keyfile", "ssl_key_password")


def _variable(field: str) -> str:
    return f"OUTBOX_KAFKA_{field.upper()}"


def _secret_from_file(values: dict[str, Any], field: str) -> None:
    """``<field>_file``: the secret's file (a mounted Kubernetes secret, a Docker secret),
    read once here; one of the two, never both."""
    path = values.get(f"{field}_file")
    if path in (None, ""):
        return
    if values.get(field) not in (None, ""):
        raise ValueError(
            f"{_variable(field)} and {_variable(field)}_FILE are both set: keep one of the two"
        )
    try:
        text = Path(str(path)).read_text()
    except OSError as error:
        raise ValueError(
            f"{_variable(field)}_FILE={path} cannot be read ({error.strerror}): "
            "mount the secret there, or set the variable without _FILE"
        ) from None
    values[field] = text.rstrip("\r\n")


class KafkaSettings(BaseSettings):
    """How every component of ours reaches the Kafka cluster: ``OUTBOX_KAFKA_*``.

    ``OUTBOX_KAFKA_BOOTSTRAP_SERVERS``: a comma-separated list of ``host:port``. Unset, the
    local stack's own broker is used; set, ``outbox stack up`` starts no broker and Connect
    (and the relay and the lake job) use this cluster instead.

    Security, named as Kafka's client configuration (``security.protocol`` is
    ``OUTBOX_KAFKA_SECURITY_PROTOCOL``...), read by every client we run (the relay, the
    consumer, reconcile, trace, the CLI, Connect's worker, the lake through
    :meth:`spark_options`) and checked here, at start-up:

    - ``OUTBOX_KAFKA_SECURITY_PROTOCOL``: ``PLAINTEXT`` (default), ``SSL`` (TLS; with a
      client certificate, mutual TLS), ``SASL_SSL`` or ``SASL_PLAINTEXT``;
    - ``OUTBOX_KAFKA_SASL_MECHANISM`` (``PLAIN``, ``SCRAM-SHA-256``, ``SCRAM-SHA-512``),
      ``OUTBOX_KAFKA_SASL_USERNAME``, ``OUTBOX_KAFKA_SASL_PASSWORD`` or
      ``OUTBOX_KAFKA_SASL_PASSWORD_FILE``: for ``SASL_*``;
    - ``OUTBOX_KAFKA_SSL_CAFILE``: the PEM certificate(s) of the authority that signed the
      brokers' certificates (default: the system's trusted authorities);
      ``OUTBOX_KAFKA_SSL_CERTFILE`` and ``OUTBOX_KAFKA_SSL_KEYFILE``: our client certificate
      and its key, PEM (mutual TLS), the key's password in ``OUTBOX_KAFKA_SSL_KEY_PASSWORD``
      or ``OUTBOX_KAFKA_SSL_KEY_PASSWORD_FILE`` if it has one;
      ``OUTBOX_KAFKA_SSL_CHECK_HOSTNAME``: whether a broker's certificate must name the host
      we reached it by (default ``true``; the chain is verified either way).

    Secrets are :class:`~pydantic.SecretStr`: never in a repr, a log line or a metric. A
    ``*_FILE`` variable is read once, here.
    """

    # hide_input_in_errors: a validation error must not quote a password it was given.
    model_config = SettingsConfigDict(
        env_prefix="OUTBOX_KAFKA_",
        extra="ignore",
        frozen=True,
        hide_input_in_errors=True,
        use_attribute_docstrings=True,
    )

    bootstrap_servers: str | None = None
    """The Kafka cluster, `host:port[,host:port...]`; unset: the local stack's broker."""
    security_protocol: SecurityProtocol = "PLAINTEXT"
    """Kafka's `security.protocol`: `PLAINTEXT`, `SSL` (TLS; with a client certificate,
    mutual TLS), `SASL_SSL` or `SASL_PLAINTEXT`."""
    sasl_mechanism: SaslMechanism | None = None
    """`PLAIN`, `SCRAM-SHA-256` or `SCRAM-SHA-512`; needed with `SASL_*`."""
    sasl_username: str | None = None
    """The SASL user (the component's principal)."""
    sasl_password: SecretStr | None = None
    """The SASL password; never logged."""
    sasl_password_file: Path | None = None
    """A file holding the SASL password (a mounted secret), read once; instead of
    `OUTBOX_KAFKA_SASL_PASSWORD`."""
    ssl_cafile: Path | None = None
    """PEM certificate(s) of the authority that signed the brokers' certificates (default: the
    system's trusted authorities)."""
    ssl_certfile: Path | None = None
    """Our client certificate, PEM (mutual TLS)."""
    ssl_keyfile: Path | None = None
    """The client certificate's key, PEM."""
    ssl_key_password: SecretStr | None = None
    """The client key's password, if it has one; never logged."""
    ssl_key_password_file: Path | None = None
    """A file holding the client key's password, read once; instead of
    `OUTBOX_KAFKA_SSL_KEY_PASSWORD`."""
    ssl_check_hostname: bool = True
    """Whether a broker's certificate must name the host we reached it by (the chain is
    verified either way)."""

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

    @field_validator("security_protocol", "sasl_mechanism", mode="before")
    @classmethod
    def _upper(cls, value: object) -> object:
        """Kafka's own spelling is upper case; accept ``sasl_ssl`` too."""
        return value.strip().upper() if isinstance(value, str) else value

    @field_validator("ssl_cafile", "ssl_certfile", "ssl_keyfile")
    @classmethod
    def _readable_file(cls, value: Path | None) -> Path | None:
        if value is not None and not os.access(value, os.R_OK):
            raise ValueError(f"{value} is not a readable file: give the path of a PEM file")
        return value

    @model_validator(mode="before")
    @classmethod
    def _secret_files(cls, values: Any) -> Any:
        if isinstance(values, dict):
            values = dict(values)
            _secret_from_file(values, "sasl_password")
            _secret_from_file(values, "ssl_key_password")
        return values

    @model_validator(mode="after")
    def _consistent(self) -> KafkaSettings:
        protocol = self.security_protocol
        named = f"OUTBOX_KAFKA_SECURITY_PROTOCOL is {protocol}"
        if protocol.startswith("SASL_"):
            missing = [_variable(name) for name in _SASL_FIELDS if not getattr(self, name)]
            if missing:
                raise ValueError(
                    f"{named}: set {', '.join(missing)} too (SASL needs a mechanism, a user "
                    "and its password; the password may come from OUTBOX_KAFKA_SASL_PASSWORD_FILE)"
                )
        else:
            stray = [_variable(name) for name in _SASL_FIELDS if getattr(self, name)]
            if stray:
                raise ValueError(
                    f"{', '.join(stray)} set but {named}, which sends no user name: set "
                    "OUTBOX_KAFKA_SECURITY_PROTOCOL=SASL_SSL, or unset them"
                )
        if not protocol.endswith("SSL"):
            stray = [_variable(name) for name in _SSL_FIELDS if getattr(self, name)]
            if stray:
                raise ValueError(
                    f"{', '.join(stray)} set but {named}, which does not use TLS: set "
                    "OUTBOX_KAFKA_SECURITY_PROTOCOL=SSL or SASL_SSL, or unset them"
                )
        if (self.ssl_certfile is None) != (self.ssl_keyfile is None):
            raise ValueError(
                "a client certificate needs both OUTBOX_KAFKA_SSL_CERTFILE and "
                "OUTBOX_KAFKA_SSL_KEYFILE (the same file twice if it holds both)"
            )
        if self.ssl_key_password is not None and self.ssl_keyfile is None:
            raise ValueError(
                "OUTBOX_KAFKA_SSL_KEY_PASSWORD is set but OUTBOX_KAFKA_SSL_KEYFILE is not: "
                "it is the password of that key"
            )
        return self

    @property
    def servers(self) -> list[str]:
        """The bootstrap servers as a list (a :class:`ConfigurationError` when unset)."""
        if self.bootstrap_servers is None:
            raise ConfigurationError(
                "OUTBOX_KAFKA_BOOTSTRAP_SERVERS is not set: no Kafka cluster to connect to"
            )
        return self.bootstrap_servers.split(",")

    @property
    def uses_tls(self) -> bool:
        return self.security_protocol in ("SSL", "SASL_SSL")

    @property
    def uses_sasl(self) -> bool:
        return self.security_protocol.startswith("SASL_")

    def with_servers(self, bootstrap_servers: str) -> KafkaSettings:
        """The same security towards other servers (the local stack's own broker)."""
        return self.model_copy(update={"bootstrap_servers": bootstrap_servers})

    def describe(self) -> str:
        """Where and how, without a secret: for logs and error messages."""
        how: str = self.security_protocol
        if self.uses_sasl:
            how += f" {self.sasl_mechanism} as {self.sasl_username}"
        if self.ssl_certfile is not None:
            how += f" with client certificate {self.ssl_certfile}"
        return f"{self.bootstrap_servers or '(no servers)'} ({how})"


def kafka_settings(value: KafkaSettings | str) -> KafkaSettings:
    """``value`` as settings: a plain ``host:port,...`` string is a cluster without security."""
    return value if isinstance(value, KafkaSettings) else KafkaSettings(bootstrap_servers=value)


def describe_validation_error(error: ValidationError, *, env_prefix: str = "OUTBOX_") -> str:
    """One line per bad setting, named as its environment variable (a rule over several
    settings names them in its message)."""
    lines = []
    for item in error.errors():
        name = "_".join(str(part) for part in item["loc"]).upper()
        lines.append(f"{env_prefix}{name}: {item['msg']}" if name else str(item["msg"]))
    return "invalid settings:\n  " + "\n  ".join(lines)
