"""Every Kafka client of ours gets its connection options here, from one
:class:`~outbox.settings.KafkaSettings`: the readers (:mod:`outbox.kafka_reading`), the
relay's producer, the CLI, Kafka Connect's worker (Java properties) and the lake job (Spark's
``kafka.*`` options). Nobody else spells ``security_protocol`` or ``sasl.jaas.config``.

It also owns what a secured connection can get wrong, so that no client hangs or retries in
silence on it:

- :func:`check_login` (called by :func:`open_client` before any kafka-python client is
  built): one login as the client will log in (the TLS session with the client's own
  :class:`ssl.SSLContext`, ``ApiVersions``, the SASL exchange), bounded in time. kafka-python
  takes a refused login or TLS handshake for a broker that is down and retries until its
  bootstrap timeout (30 s), then says only "Unable to bootstrap"; this check says within
  seconds whether the password or user was refused, the broker's certificate is untrusted or
  names another host, or our own certificate was refused.
- :func:`kafka_errors`: kafka-python's errors as ours (``from`` the original): a refused
  SASL login is :class:`~outbox.core.errors.BrokerAuthenticationError`, an operation outside
  the principal's ACLs :class:`~outbox.core.errors.BrokerAuthorizationError` naming what was
  refused, no answer :class:`~outbox.core.errors.BrokerUnavailable`.

Secrets (the SASL password, the key and its password) leave :class:`~pydantic.SecretStr`
only in the options handed to a client; :func:`java_client_config` keeps them out of the
properties it returns (``${env:NAME}`` references, the values beside them).

kafka-python is imported inside functions only (the ``relay`` extra).
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import struct
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

from outbox.core.errors import (
    BrokerAuthenticationError,
    BrokerAuthorizationError,
    BrokerError,
    BrokerUnavailable,
    ConfigurationError,
    RecordsGoneError,
)
from outbox.settings import KafkaSettings

__all__ = [
    "JavaClientConfig",
    "check_login",
    "client_options",
    "java_client_config",
    "kafka_errors",
    "open_client",
    "spark_options",
    "ssl_context",
]

T = TypeVar("T")

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
_CHECK_SECONDS = 10.0


# -- kafka-python -------------------------------------------------------------------------


def _no_password() -> str:
    raise ConfigurationError(
        "OUTBOX_KAFKA_SSL_KEYFILE is encrypted: give its password in "
        "OUTBOX_KAFKA_SSL_KEY_PASSWORD or OUTBOX_KAFKA_SSL_KEY_PASSWORD_FILE"
    )


def ssl_context(settings: KafkaSettings) -> ssl.SSLContext | None:
    """The TLS context of every kafka-python client (and of :func:`check_login`): the brokers'
    certificates verified against ``OUTBOX_KAFKA_SSL_CAFILE`` (or the system's authorities),
    their host names checked unless ``OUTBOX_KAFKA_SSL_CHECK_HOSTNAME=false``, our client
    certificate when one is set. ``None`` without TLS."""
    if not settings.uses_tls:
        return None
    try:
        context = ssl.create_default_context(
            cafile=None if settings.ssl_cafile is None else str(settings.ssl_cafile)
        )
    except (ssl.SSLError, OSError) as error:
        raise ConfigurationError(
            f"OUTBOX_KAFKA_SSL_CAFILE={settings.ssl_cafile} holds no usable PEM certificate "
            f"({error}): give the certificate authority's certificate, PEM"
        ) from None
    context.check_hostname = settings.ssl_check_hostname
    context.verify_mode = ssl.CERT_REQUIRED  # the chain is verified even without host names
    if settings.ssl_certfile is not None:
        password = settings.ssl_key_password
        try:
            context.load_cert_chain(
                str(settings.ssl_certfile),
                None if settings.ssl_keyfile is None else str(settings.ssl_keyfile),
                # Never None: OpenSSL would prompt on the terminal for an encrypted key's
                # password, and a service would wait there for ever.
                password=_no_password if password is None else password.get_secret_value(),
            )
        except (ssl.SSLError, OSError) as error:
            raise ConfigurationError(
                f"the client certificate OUTBOX_KAFKA_SSL_CERTFILE={settings.ssl_certfile} "
                f"with OUTBOX_KAFKA_SSL_KEYFILE={settings.ssl_keyfile} cannot be loaded "
                f"({error}): give a PEM certificate and its PEM key; if the key is encrypted, "
                "its password in OUTBOX_KAFKA_SSL_KEY_PASSWORD(_FILE)"
            ) from None
    return context


def client_options(settings: KafkaSettings, *, client_id: str) -> dict[str, Any]:
    """The options every kafka-python client of ours starts from (consumer, producer, admin):
    the servers, who we are, and how we prove it. (Consumers and producers add
    ``metrics_enabled=False``: kafka-python's per-topic metric names collide for ``a.b`` and
    ``a_b``; its admin client has no such option.)"""
    options: dict[str, Any] = {
        "bootstrap_servers": settings.servers,
        "client_id": client_id,
        "security_protocol": settings.security_protocol,
    }
    context = ssl_context(settings)
    if context is not None:
        options["ssl_context"] = context
    if settings.uses_sasl:
        assert settings.sasl_password is not None  # checked by the settings
        options["sasl_mechanism"] = settings.sasl_mechanism
        options["sasl_plain_username"] = settings.sasl_username
        options["sasl_plain_password"] = settings.sasl_password.get_secret_value()
    return options


def open_client(settings: KafkaSettings, make: Callable[..., T], options: dict[str, Any]) -> T:
    """``make(**options)`` (a kafka-python client) after :func:`check_login`, with
    kafka-python's errors as ours (:func:`kafka_errors`). A client that could not bootstrap
    is checked once more: a login refused meanwhile is said as such, not as no answer."""
    check_login(settings)
    try:
        with kafka_errors(settings):
            return make(**options)
    except BrokerUnavailable:
        check_login(settings)
        raise


# -- what can go wrong ---------------------------------------------------------------------


class _Wire:
    """Kafka's request/response framing on one socket: just enough for :func:`check_login`
    (ApiVersions v0, SaslHandshake v1, SaslAuthenticate v1, whose layouts never change)."""

    def __init__(self, connection: socket.socket) -> None:
        self._connection = connection
        self._correlation = 0

    def call(self, api_key: int, version: int, body: bytes) -> bytes:
        self._correlation += 1
        client_id = b"outbox-login-check"
        header = struct.pack(">hhih", api_key, version, self._correlation, len(client_id))
        frame = header + client_id + body
        self._connection.sendall(struct.pack(">i", len(frame)) + frame)
        (size,) = struct.unpack(">i", self._read(4))
        answer = self._read(size)
        return answer[4:]  # past the correlation id (a response header v0)

    def _read(self, size: int) -> bytes:
        chunks = b""
        while len(chunks) < size:
            chunk = self._connection.recv(size - len(chunks))
            if not chunk:
                raise ConnectionResetError("the broker closed the connection")
            chunks += chunk
        return chunks


def _string(value: str) -> bytes:
    data = value.encode()
    return struct.pack(">h", len(data)) + data


def _read_string(data: bytes, at: int) -> tuple[str | None, int]:
    (size,) = struct.unpack_from(">h", data, at)
    at += 2
    if size < 0:
        return None, at
    return data[at : at + size].decode(errors="replace"), at + size


def _sasl_login(wire: _Wire, settings: KafkaSettings, host: str, server: str) -> None:
    """SaslHandshake and SaslAuthenticate with kafka-python's own mechanism (SCRAM, PLAIN);
    a :class:`BrokerAuthenticationError` when the broker refuses."""
    from kafka.net.sasl import get_sasl_mechanism

    mechanism_name = settings.sasl_mechanism or ""
    answer = wire.call(17, 1, _string(mechanism_name))
    (error_code, count) = struct.unpack_from(">hi", answer, 0)
    offered, at = [], 6
    for _ in range(max(0, count)):
        name, at = _read_string(answer, at)
        offered.append(name or "")
    if error_code != 0 or mechanism_name not in offered:
        raise BrokerAuthenticationError(
            f"Kafka at {server} does not offer SASL mechanism {mechanism_name} on this "
            f"listener (it offers {', '.join(offered) or 'none'}): set "
            "OUTBOX_KAFKA_SASL_MECHANISM to one of those",
            reason="mechanism",
        )
    options = client_options(settings, client_id="outbox-login-check")
    mechanism = get_sasl_mechanism(mechanism_name)(host=host, **options)
    while not mechanism.is_done():
        token = mechanism.auth_bytes()
        answer = wire.call(36, 1, struct.pack(">i", len(token)) + token)
        (error_code,) = struct.unpack_from(">h", answer, 0)
        message, at = _read_string(answer, 2)
        if error_code != 0:
            raise BrokerAuthenticationError(
                f"Kafka at {server} refused the login of user {settings.sasl_username!r} "
                f"({mechanism_name}): wrong password or unknown user (Kafka does not say which, "
                f"on purpose; it answered: {message}); check OUTBOX_KAFKA_SASL_USERNAME and "
                "OUTBOX_KAFKA_SASL_PASSWORD(_FILE), and that the user exists for "
                f"{mechanism_name}",
                reason="credentials",
            )
        (size,) = struct.unpack_from(">i", answer, at)
        mechanism.receive(answer[at + 4 : at + 4 + max(0, size)])


@dataclass(frozen=True)
class _Refusal:
    reason: Literal["untrusted_certificate", "hostname", "client_certificate", "tls"]
    message: str


def _tls_refusal(error: BaseException, server: str, settings: KafkaSettings) -> _Refusal:
    """What a failed TLS session with ``server`` means, in words that name the fix."""
    if isinstance(error, ssl.SSLCertVerificationError):
        code = getattr(error, "verify_code", None)
        detail = getattr(error, "verify_message", None) or str(error)
        if code == 62 or "hostname" in detail.lower() or "ip address mismatch" in detail.lower():
            return _Refusal(
                "hostname",
                f"the certificate of {server} does not name the host we reached it by "
                f"({detail}): use the name the certificate gives in "
                "OUTBOX_KAFKA_BOOTSTRAP_SERVERS, or (last resort) "
                "OUTBOX_KAFKA_SSL_CHECK_HOSTNAME=false",
            )
        trusted = (
            f"OUTBOX_KAFKA_SSL_CAFILE={settings.ssl_cafile}"
            if settings.ssl_cafile is not None
            else "the system's certificate authorities (OUTBOX_KAFKA_SSL_CAFILE is not set)"
        )
        return _Refusal(
            "untrusted_certificate",
            f"the certificate of {server} is not trusted ({detail}): it was not signed by "
            f"{trusted}; set OUTBOX_KAFKA_SSL_CAFILE to the authority that signed the "
            "brokers' certificates",
        )
    text = str(error)
    lowered = text.lower().replace("_", " ")
    alerts = ("certificate required", "bad certificate", "unknown ca", "certificate unknown")
    if any(alert in lowered for alert in alerts):
        mine = (
            f"OUTBOX_KAFKA_SSL_CERTFILE={settings.ssl_certfile}"
            if settings.ssl_certfile is not None
            else "none (OUTBOX_KAFKA_SSL_CERTFILE is not set)"
        )
        return _Refusal(
            "client_certificate",
            f"{server} refused our client certificate, {mine} ({text}): the broker wants a "
            "certificate signed by an authority it trusts (its ssl.truststore)",
        )
    hint = (
        ": does that listener speak TLS? (OUTBOX_KAFKA_SECURITY_PROTOCOL)"
        if "wrong version number" in lowered or "record layer failure" in lowered
        else ""
    )
    return _Refusal(
        "tls", f"the TLS session with {server} failed: {type(error).__name__}: {text}{hint}"
    )


def check_login(settings: KafkaSettings, *, timeout_seconds: float = _CHECK_SECONDS) -> None:
    """Log in to one bootstrap server as every client of ours will, within
    ``timeout_seconds``: the TLS session with the clients' own context, ``ApiVersions``, and
    the SASL exchange with their mechanism and credentials. Raise
    :class:`~outbox.core.errors.BrokerAuthenticationError` (``reason``: credentials,
    mechanism, untrusted_certificate, hostname, client_certificate or tls) when that is
    refused.

    Why: kafka-python (3.0) takes a refused login or TLS handshake for a broker that is down
    and retries until its bootstrap timeout (30 s), then says only "Unable to bootstrap".
    Nothing to check with ``PLAINTEXT``; nothing raised either when no server answers at all
    (the client then reports :class:`~outbox.core.errors.BrokerUnavailable`, as without
    security) or answers too slowly.
    """
    if settings.security_protocol == "PLAINTEXT":
        return
    context = ssl_context(settings)
    deadline = time.monotonic() + timeout_seconds
    for server in settings.servers:
        host, _, port = server.rpartition(":")
        host = host.strip("[]")
        left = deadline - time.monotonic()
        if left <= 0:
            return
        try:
            plain = socket.create_connection((host, int(port)), timeout=left)
        except OSError:
            continue  # this one does not answer: the next, or the client's own timeout
        try:
            connection = (
                plain if context is None else context.wrap_socket(plain, server_hostname=host)
            )
            with connection:
                connection.settimeout(max(0.1, deadline - time.monotonic()))
                wire = _Wire(connection)
                # ApiVersions: allowed before SASL; its answer proves the broker took the TLS
                # session (with TLS 1.3 a refused client certificate shows only on reading).
                wire.call(18, 0, b"")
                if settings.uses_sasl:
                    _sasl_login(wire, settings, host, server)
            return
        except TimeoutError:
            return  # slow, not refused: leave it to the client's own timeouts
        except (ssl.SSLError, ConnectionError) as error:
            if context is None:
                raise BrokerAuthenticationError(
                    f"Kafka at {server} closed the connection during the login "
                    f"({type(error).__name__}: {error}): does its listener speak "
                    f"{settings.security_protocol}? (OUTBOX_KAFKA_SECURITY_PROTOCOL)",
                    reason="tls",
                ) from error
            refusal = _tls_refusal(error, server, settings)
            raise BrokerAuthenticationError(
                f"Kafka at {settings.bootstrap_servers}: {refusal.message}",
                reason=refusal.reason,
            ) from error
        finally:
            with contextlib.suppress(OSError):
                plain.close()


def _names(error: Exception) -> str:
    found = error.args[0] if error.args else ""
    if isinstance(found, set | frozenset | list | tuple):
        return ", ".join(sorted(str(name) for name in found))
    return str(found)


def authorization_error(error: Exception, settings: KafkaSettings) -> BrokerAuthorizationError:
    """kafka-python's ``*AuthorizationFailedError`` as ours: which resource, by which principal."""
    from kafka import errors

    kinds: list[tuple[type[Exception], str]] = [
        (errors.TopicAuthorizationFailedError, "topic"),
        (errors.GroupAuthorizationFailedError, "group"),
        (errors.TransactionalIdAuthorizationFailedError, "transactional_id"),
        (errors.ClusterAuthorizationFailedError, "cluster"),
    ]
    resource = next((kind for cls, kind in kinds if isinstance(error, cls)), "resource")
    names = _names(error)
    who = settings.sasl_username if settings.uses_sasl else None
    principal = f"User:{who}" if who else "our principal"
    what = f"{resource} {names}" if names and resource != "cluster" else resource
    return BrokerAuthorizationError(
        f"Kafka at {settings.bootstrap_servers} refused {principal} access to {what}: not "
        f"authorized ({type(error).__name__}); grant the ACL docs/production.md lists for "
        "this component",
        resource=resource,
        names=names,
    )


@contextmanager
def kafka_errors(settings: KafkaSettings) -> Iterator[None]:
    """kafka-python's errors as ours, each ``from`` the original (see the module)."""
    from kafka import errors

    servers = settings.bootstrap_servers
    try:
        yield
    except errors.OffsetOutOfRangeError as error:
        positions = error.args[0] if error.args and isinstance(error.args[0], dict) else {}
        (topic, partition), offset = next(iter(positions.items()), (("?", -1), -1))
        raise RecordsGoneError(
            f"{topic}[{partition}]: the records from offset {offset} on are gone from Kafka "
            "(deleted by retention, or the topic was recreated)",
            topic=topic,
            partition=partition,
            offset=offset,
        ) from error
    except errors.AuthorizationError as error:
        raise authorization_error(error, settings) from error
    except (errors.SaslAuthenticationFailedError, errors.UnsupportedSaslMechanismError) as error:
        raise authentication_error(error, settings) from error
    except errors.RetriableError as error:  # timeouts, connections, no leader: no answer
        raise BrokerUnavailable(
            f"Kafka at {servers} did not answer: {type(error).__name__}: {error}"
        ) from error
    except errors.KafkaError as error:
        raise BrokerError(f"Kafka at {servers}: {type(error).__name__}: {error}") from error


def authentication_error(error: Exception, settings: KafkaSettings) -> BrokerAuthenticationError:
    """A refused SASL login as ours. Kafka answers a wrong password and an unknown user
    alike, on purpose (it does not tell who exists): the message says so."""
    from kafka import errors

    if isinstance(error, errors.UnsupportedSaslMechanismError):
        return BrokerAuthenticationError(
            f"Kafka at {settings.bootstrap_servers} does not offer SASL mechanism "
            f"{settings.sasl_mechanism} ({error}): set OUTBOX_KAFKA_SASL_MECHANISM to one "
            "its listener enables (sasl.enabled.mechanisms)",
            reason="mechanism",
        )
    return BrokerAuthenticationError(
        f"Kafka at {settings.bootstrap_servers} refused the login of user "
        f"{settings.sasl_username!r} ({settings.sasl_mechanism}): wrong password or unknown "
        f"user (Kafka does not say which; {error}); check OUTBOX_KAFKA_SASL_USERNAME and "
        "OUTBOX_KAFKA_SASL_PASSWORD(_FILE), and that the user exists for this mechanism",
        reason="credentials",
    )


# -- Java clients: Kafka Connect, Spark ----------------------------------------------------


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


def _java_properties(settings: KafkaSettings, secret: Callable[[str, str], str]) -> dict[str, str]:
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

    return JavaClientConfig(_java_properties(settings, reference), environment)


def spark_options(settings: KafkaSettings) -> dict[str, str]:
    """Spark's Kafka source and sink options for ``settings``: each Java client property
    prefixed ``kafka.`` (``kafka.bootstrap.servers``, ``kafka.security.protocol``,
    ``kafka.sasl.mechanism``, ``kafka.sasl.jaas.config``, ``kafka.ssl.truststore.type=PEM``
    with the certificates inline, so executors need no file...).

    Secrets are inline (Spark hands these options to its executors' consumers): never log
    the result nor show it in Spark's UI (``spark.redaction.regex`` covers ``password`` and
    ``jaas`` by default; add ``ssl.keystore.key`` to it for a client certificate).
    """
    properties = _java_properties(settings, lambda _variable, value: value)
    return {f"kafka.{name}": value for name, value in properties.items()}
