"""A TLS refusal from PostgreSQL's drivers becomes our ``DatabaseTlsError``, saying which check
failed and the fix: libpq's words (psycopg: the SDK, the relay, the CLI) and the JDBC driver's
(Debezium's connector), each as the driver says it."""

from __future__ import annotations

import ssl

import psycopg
import pytest
from sqlalchemy import exc

from outbox import DatabaseError, DatabaseTlsError, OutboxError
from outbox.core.database_tls import TlsFailure, tls_error, tls_failure_of
from outbox.database_errors import database_error
from outbox_cli._common import USER_ERROR, describe

AT = 'connection failed: connection to server at "127.0.0.1", port 54329 failed: '
SAID = {
    # libpq 18 (psycopg's binary wheel), as the tests against the stack's server saw them
    AT + "SSL error: certificate verify failed": TlsFailure.UNTRUSTED_CERTIFICATE,
    AT + 'server certificate for "localhost" (and 1 other name) does not match host name '
    '"db.invalid"': TlsFailure.HOST_NOT_IN_CERTIFICATE,
    AT + 'server certificate for "db.example" does not match host name "db"': (
        TlsFailure.HOST_NOT_IN_CERTIFICATE
    ),
    AT + 'root certificate file "/nowhere/ca.crt" does not exist\nEither provide the file, '
    "use the system's trusted roots with sslrootcert=system, or change sslmode to disable "
    "server certificate verification.": TlsFailure.CA_FILE_UNREADABLE,
    AT + "server does not support SSL, but SSL was required": TlsFailure.SERVER_WITHOUT_TLS,
    # PostgreSQL's JDBC driver 42.7 in Debezium 3.6, through Connect's config validation
    "database.hostname: Error while validating connector config: SSL error: PKIX path "
    "building failed: sun.security.provider.certpath.SunCertPathBuilderException: unable to "
    "find valid certification path to requested target": TlsFailure.UNTRUSTED_CERTIFICATE,
    "database.hostname: Error while validating connector config: The hostname 127.0.0.2 could "
    "not be verified by hostnameverifier PgjdbcHostnameVerifier.": (
        TlsFailure.HOST_NOT_IN_CERTIFICATE
    ),
    "database.hostname: Error while validating connector config: Could not open SSL root "
    "certificate file /nowhere/ca.crt.": TlsFailure.CA_FILE_UNREADABLE,
    "The server does not support SSL.": TlsFailure.SERVER_WITHOUT_TLS,
}
NOT_TLS = [
    AT + 'FATAL:  password authentication failed for user "postgres"',
    AT + "Connection refused\n\tIs the server running on that host and accepting TCP/IP "
    "connections?",
    AT + 'FATAL:  no pg_hba.conf entry for host "127.0.0.1", user "u", database "d", no encryption',
]


@pytest.mark.parametrize(("message", "failure"), SAID.items(), ids=[f.name for f in SAID.values()])
def test_each_drivers_words_name_the_failure(message: str, failure: TlsFailure) -> None:
    assert tls_failure_of(message) is failure
    error = tls_error(message)
    assert isinstance(error, DatabaseTlsError) and isinstance(error, DatabaseError | OutboxError)
    assert error.failure == failure.value
    text = str(error)
    assert text.startswith("TLS with PostgreSQL failed: ")
    assert " ".join(message.split()) in text, "the driver's own words are kept"
    assert "\n" not in text


@pytest.mark.parametrize("message", NOT_TLS)
def test_other_failures_are_not_taken_for_tls(message: str) -> None:
    assert tls_failure_of(message) is None and tls_error(message) is None


def test_psycopg_and_sqlalchemy_errors_become_ours() -> None:
    refused = psycopg.OperationalError(AT + "SSL error: certificate verify failed")
    wrapped = exc.OperationalError("SELECT 1", {}, refused)
    for error in (refused, wrapped):
        ours = database_error(error)
        assert isinstance(ours, DatabaseTlsError)
        assert ours.failure == TlsFailure.UNTRUSTED_CERTIFICATE
    assert database_error(psycopg.OperationalError(NOT_TLS[0])) is None


def test_a_tls_error_that_is_not_the_databases_is_left_alone() -> None:
    """Kafka's clients fail TLS with the same words: only the database driver's errors are
    ours to call a PostgreSQL refusal."""
    assert database_error(ssl.SSLCertVerificationError("certificate verify failed")) is None
    assert database_error(ValueError("certificate verify failed")) is None


def test_the_cli_says_which_check_failed_in_one_line() -> None:
    line, status = describe(
        exc.OperationalError(
            None, None, psycopg.OperationalError(AT + "SSL error: certificate verify failed")
        )
    ) or ("", 0)
    assert status == USER_ERROR
    assert line.startswith("error: TLS with PostgreSQL failed: PostgreSQL's certificate is not")
    assert "sslrootcert" in line
