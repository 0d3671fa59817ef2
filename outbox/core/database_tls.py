"""Why TLS with PostgreSQL failed, read from a driver's message. (Pure.)

libpq (psycopg: the SDK, the relay, the CLI) and PostgreSQL's JDBC driver (Debezium's
connector) say it in words of their own; both come down to four failures, each with its fix:

- :attr:`TlsFailure.UNTRUSTED_CERTIFICATE`: the server's certificate is not signed by a CA
  in the client's CA file (``sslrootcert``), or it has expired;
- :attr:`TlsFailure.HOST_NOT_IN_CERTIFICATE`: it is valid, but for other names than the host
  the client connected to (``sslmode=verify-full`` checks the name);
- :attr:`TlsFailure.CA_FILE_UNREADABLE`: the CA file the client names cannot be read;
- :attr:`TlsFailure.SERVER_WITHOUT_TLS`: the server offers no TLS and the client requires it.

:func:`tls_error` turns a message into a :class:`~outbox.core.errors.DatabaseTlsError` that
names the failure and its fix, keeping the driver's own words.
"""

from __future__ import annotations

import re
from enum import StrEnum

from outbox.core.errors import DatabaseTlsError

__all__ = ["TlsFailure", "tls_error", "tls_failure_of"]


class TlsFailure(StrEnum):
    UNTRUSTED_CERTIFICATE = "untrusted certificate"
    HOST_NOT_IN_CERTIFICATE = "host not in certificate"
    CA_FILE_UNREADABLE = "CA file unreadable"
    SERVER_WITHOUT_TLS = "server without TLS"


# libpq's messages (fe-secure-openssl.c, fe-secure-common.c, fe-connect.c), then pgjdbc's
# (LibPQFactory, PGjdbcHostnameVerifier, ConnectionFactoryImpl).
_SIGNS: tuple[tuple[TlsFailure, re.Pattern[str]], ...] = (
    (
        TlsFailure.HOST_NOT_IN_CERTIFICATE,
        re.compile(
            r"server certificate for \".*\" (\(and \d+ other names?\) )?does not match host name"
            r"|could not get server's host name from server certificate"
            r"|could not be verified by hostnameverifier"
            r"|Server name validation failed"
            r"|No subject alternative (DNS )?names? matching"
        ),
    ),
    (
        TlsFailure.CA_FILE_UNREADABLE,
        re.compile(
            r"root certificate file \".*\" does not exist"
            r"|could not read root certificate file"
            r"|Could not (open|read) SSL root certificate file"
        ),
    ),
    (
        TlsFailure.SERVER_WITHOUT_TLS,
        re.compile(
            r"server does not support SSL, but SSL was required"
            r"|The server does not support SSL"
        ),
    ),
    (
        TlsFailure.UNTRUSTED_CERTIFICATE,
        re.compile(
            r"certificate verify failed"
            r"|PKIX path (building|validation) failed"
            r"|unable to find valid certification path"
            r"|CertificateExpiredException"
        ),
    ),
)

_FIXES = {
    TlsFailure.UNTRUSTED_CERTIFICATE: (
        "PostgreSQL's certificate is not trusted: it is not signed by a CA in the file "
        "sslrootcert names, or it has expired; give the CA that issued it (sslrootcert=PATH "
        "in the database URL, OUTBOX_CONNECT_DATABASE_SSLROOTCERT for the connector)"
    ),
    TlsFailure.HOST_NOT_IN_CERTIFICATE: (
        "PostgreSQL's certificate is not for the host connected to: connect by a name the "
        "certificate holds (the local stack's: 127.0.0.1 or localhost), or have it reissued "
        "with this one"
    ),
    TlsFailure.CA_FILE_UNREADABLE: (
        "the CA file sslrootcert names cannot be read: give the path of the CA certificate "
        "(PEM) that issued PostgreSQL's certificate"
    ),
    TlsFailure.SERVER_WITHOUT_TLS: (
        "PostgreSQL offers no TLS and the client requires it: turn ssl on in the server, or "
        "connect to one that has it"
    ),
}


def tls_failure_of(message: str) -> TlsFailure | None:
    """Which TLS failure a driver's error message reports; None when it reports none."""
    for failure, sign in _SIGNS:
        if sign.search(message):
            return failure
    return None


def tls_error(message: str) -> DatabaseTlsError | None:
    """The :class:`DatabaseTlsError` for a driver's error message, naming the failure and its
    fix, the driver's words after it; None when the message reports no TLS failure."""
    failure = tls_failure_of(message)
    if failure is None:
        return None
    said = " ".join(message.split())
    return DatabaseTlsError(
        f"TLS with PostgreSQL failed: {_FIXES[failure]} (the driver said: {said})",
        failure=failure.value,
    )
