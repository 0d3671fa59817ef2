"""Role passwords never reach PostgreSQL: the client sends a SCRAM verifier.

The CLI runs with ``log_statement=all`` for its session (``PGOPTIONS``): every statement
and its parameters land in the server's log, which is then searched for the password.
"""

from __future__ import annotations

import secrets
import uuid

import psycopg
import pytest

from tests.cli import run_outbox
from tests.fix_postgres import ScratchDatabase

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize(
    ("command", "variable"),
    [
        ("cdc-role", "OUTBOX_CONNECT_DATABASE_PASSWORD"),
        ("relay-role", "OUTBOX_RELAY_DATABASE_PASSWORD"),
    ],
)
def test_a_role_password_is_never_sent_to_the_server(
    database: ScratchDatabase, command: str, variable: str
) -> None:
    role = f"pw_{uuid.uuid4().hex[:8]}"
    password = f"Sesame-{secrets.token_hex(8)}"
    log = database.cluster.log_file
    start = log.stat().st_size
    env = {
        "OUTBOX_DATABASE_URL": database.url,
        variable: password,
        "PGOPTIONS": "-c log_statement=all",
    }
    try:
        for _ in range(2):  # create, then reset (ALTER ROLE)
            result = run_outbox("db", command, role, env=env)
            assert result.returncode == 0, result.stderr
        with log.open("rb") as handle:
            handle.seek(start)
            written = handle.read().decode(errors="replace")
        assert f'ROLE "{role}"' in written, "log_statement=all did not log the session"
        assert "SCRAM-SHA-256$" in written
        assert password not in written, "the password reached PostgreSQL's log"
        as_role = psycopg.conninfo.make_conninfo(database.conninfo, user=role, password=password)
        with psycopg.connect(as_role) as connection:  # the verifier matches the password
            assert connection.execute("SELECT current_user").fetchone() == (role,)
    finally:
        with database.connect(autocommit=True) as admin:
            name = psycopg.sql.Identifier(role)
            admin.execute(psycopg.sql.SQL("DROP OWNED BY {}").format(name))
            admin.execute(psycopg.sql.SQL("DROP ROLE IF EXISTS {}").format(name))
