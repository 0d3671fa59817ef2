"""Kafka's Java client properties for one :class:`~outbox.settings.KafkaSettings`: Kafka
Connect's worker (:func:`java_client_config`: secrets as ``${env:NAME}`` references, their
values beside them) and Spark's Kafka source (:func:`java_properties` with the secrets
inline: :mod:`outbox_lake.kafka_options`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from outbox.core.errors import ConfigurationError
from outbox.settings import KafkaSettings

__all__ = ["JAVA_SECRET_VARIABLES", "JavaClientConfig", "java_client_config", "java_properties"]

# The environment variables that carry the secrets to a Java client (Kafka Connect's worker
# resolves them with its EnvVarConfigProvider): the settings' own names.
SASL_PASSWORD_VARIABLE = "OUTBOX_KAFKA_SASL_PASSWORD"  # noqa: S105 - a name, not a password
SSL_KEY_VARIABLE = "OUTBOX_KAFKA_SSL_KEY"
SSL_KEY_PASSWORD_VARIABLE = "OUTBOX_KAFKA_SSL_KEY_PASSWORD"  # noqa: S105 - a name
JAVA_SECRET_VARIABLES = (SASL_PASSWORD_VARIABLE, SSL_KEY_VARIABLE, SSL_KEY_PASSWORD_VARIABLE)

_LOGIN_MODULES = {
    "PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
    "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule",
}


@dataclass(frozen=True)
class JavaClientConfig:
    """A Java Kafka client's security properties, and the secrets they reference.

    ``properties`` hold no secret: each is a ``${env:NAME}`` reference (an
    ``EnvVarConfigProvider`` named ``env`` resolves it) to a variable of ``environment``.
    """

    properties: dict[str, str]
    environment: dict[str, str] = field(default_factory=dict, repr=False)


def _jaas_quoted(value: str, variable: str) -> str:
    if '"' in value or "\\" in value:
        raise ConfigurationError(
            f"{variable} holds a double quote or a backslash, which Java's JAAS configuration "
            "of Kafka's clients cannot take: choose one without"
        )
    return f'"{value}"'


def java_properties(settings: KafkaSettings, secret: Callable[[str, str], str]) -> dict[str, str]:
    """Kafka's Java client properties for ``settings``; ``secret(variable, value)`` spells a
    secret (a reference, or the value itself)."""
    properties = {
        "bootstrap.servers": ",".join(settings.servers),
        "security.protocol": settings.security_protocol,
    }
    if settings.uses_sasl:
        assert settings.sasl_mechanism is not None and settings.sasl_password is not None
        user = _jaas_quoted(settings.sasl_username or "", "OUTBOX_KAFKA_SASL_USERNAME")
        password = secret(
            SASL_PASSWORD_VARIABLE,
            _jaas_quoted(settings.sasl_password.get_secret_value(), SASL_PASSWORD_VARIABLE)[1:-1],
        )
        properties["sasl.mechanism"] = settings.sasl_mechanism
        properties["sasl.jaas.config"] = (
            f"{_LOGIN_MODULES[settings.sasl_mechanism]} required "
            f'username={user} password="{password}";'
        )
    if settings.uses_tls:
        if settings.ssl_cafile is not None:
            properties["ssl.truststore.type"] = "PEM"
            properties["ssl.truststore.certificates"] = _pem(settings.ssl_cafile)
        properties["ssl.endpoint.identification.algorithm"] = (
            "https" if settings.ssl_check_hostname else ""
        )
        if settings.ssl_certfile is not None and settings.ssl_keyfile is not None:
            properties["ssl.keystore.type"] = "PEM"
            properties["ssl.keystore.certificate.chain"] = _pem(
                settings.ssl_certfile, "CERTIFICATE"
            )
            properties["ssl.keystore.key"] = secret(
                SSL_KEY_VARIABLE, _pem(settings.ssl_keyfile, "PRIVATE KEY")
            )
            if settings.ssl_key_password is not None:
                properties["ssl.key.password"] = secret(
                    SSL_KEY_PASSWORD_VARIABLE, settings.ssl_key_password.get_secret_value()
                )
    return properties


def _pem(path: Path, kind: str | None = None) -> str:
    """The PEM blocks of a file (those of ``kind`` only, e.g. the certificates of a file that
    also holds the key), as Kafka's PEM store reads them inline."""
    text = path.read_text()
    blocks: list[str] = []
    inside: list[str] | None = None
    for line in text.splitlines():
        if line.startswith("-----BEGIN "):
            inside = [line]
        elif inside is not None:
            inside.append(line)
            if line.startswith("-----END "):
                label = inside[0][len("-----BEGIN ") :].rstrip("-")
                if kind is None or label.endswith(kind):
                    blocks.append("\n".join(inside))
                inside = None
    if kind == "PRIVATE KEY" and blocks and "RSA PRIVATE KEY" in blocks[0]:
        raise ConfigurationError(
            f"OUTBOX_KAFKA_SSL_KEYFILE={path} is a PKCS#1 key ('BEGIN RSA PRIVATE KEY'), which "
            "Kafka's Java clients (Connect, Spark) cannot read: convert it to PKCS#8 with "
            "`openssl pkcs8 -topk8 -in key.pem -out key.pk8.pem` (add -nocrypt for no password)"
        )
    if not blocks:
        raise ConfigurationError(f"{path} holds no PEM {kind or 'block'}")
    return "\n".join(blocks)


def java_client_config(settings: KafkaSettings) -> JavaClientConfig:
    """Kafka's Java client properties (``bootstrap.servers``, ``security.protocol``,
    ``sasl.*``, ``ssl.*``) for ``settings``, secrets as ``${env:NAME}`` references with their
    values in :attr:`JavaClientConfig.environment` (Kafka Connect's worker)."""
    environment: dict[str, str] = {}

    def reference(variable: str, value: str) -> str:
        environment[variable] = value
        return "${env:" + variable + "}"

    return JavaClientConfig(java_properties(settings, reference), environment)
