"""Our errors for what PostgreSQL's driver raised, at the edge where we meet them.

A connection refused over TLS (a certificate the client does not trust, a host name not in
it, an unreadable CA file, a server without TLS) becomes a
:class:`~outbox.core.errors.DatabaseTlsError` that says which and how to fix it
(:mod:`outbox.core.database_tls`). The idempotent consumer raises it instead of retrying a
database "outage" for ever, the relay stops on it, and the ``outbox`` command prints it as
its one line.
"""

from __future__ import annotations

import psycopg
from sqlalchemy import exc

from outbox.core.database_tls import tls_error
from outbox.core.errors import DatabaseError

__all__ = ["database_error"]


def database_error(error: BaseException) -> DatabaseError | None:
    """The error of ours that ``error`` (psycopg's, or SQLAlchemy's around psycopg's) is;
    None when it is none of ours (then it stays the driver's)."""
    if isinstance(error, exc.DBAPIError) and error.orig is not None:
        error = error.orig
    if isinstance(error, psycopg.OperationalError):
        return tls_error(str(error))
    return None
