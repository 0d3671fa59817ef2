"""One login to the cluster as every client of ours will log in, bounded in time:
:func:`check_login` (called by :func:`outbox.kafka_clients.open_client` before any
kafka-python client is built).

kafka-python takes a refused login or TLS handshake for a broker that is down and retries
until its bootstrap timeout (30 s), then says only "Unable to bootstrap"; this check says
within seconds whether the password or user was refused, the broker's certificate is
untrusted or names another host, or our own certificate was refused."""

from __future__ import annotations

import contextlib
import socket
import ssl
import struct
import time
from dataclasses import dataclass
from typing import Literal

from outbox.core.errors import BrokerAuthenticationError
from outbox.kafka_options import client_options, ssl_context
from outbox.settings import KafkaSettings

__all__ = ["check_login"]

_CHECK_SECONDS = 10.0


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
