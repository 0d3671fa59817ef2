"""Migrations: own version table, beside an application's own Alembic history."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import psycopg
import pytest
import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory

import outbox_migrations
from outbox import Event, Outbox, OutboxSettings
from tests.cli import run_outbox
from tests.fix_postgres import ScratchDatabase

pytestmark = pytest.mark.timeout(120)

APP_ENV = """
from alembic import context
from sqlalchemy import create_engine

import outbox_migrations

engine = create_engine(context.config.get_main_option("sqlalchemy.url"))
with engine.connect() as connection:
    context.configure(connection=connection)
    with context.begin_transaction():
        context.run_migrations()
    connection.commit()
    if context.config.attributes.get("with_outbox"):
        # The documented way to include the outbox migrations in an application's env.py.
        outbox_migrations.upgrade(connection)
        connection.commit()
engine.dispose()
"""

APP_REVISION = """
from alembic import op
import sqlalchemy as sa

revision = "app_0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade():
    op.create_table("app_things", sa.Column("id", sa.Integer, primary_key=True))


def downgrade():
    op.drop_table("app_things")
"""


def application_alembic(tmp_path: Path, url: str, *, with_outbox: bool = False) -> Config:
    """A host application's own Alembic project, with its default `alembic_version` table."""
    (tmp_path / "versions").mkdir(parents=True, exist_ok=True)
    (tmp_path / "env.py").write_text(textwrap.dedent(APP_ENV))
    (tmp_path / "versions" / "app_0001.py").write_text(textwrap.dedent(APP_REVISION))
    config = Config()
    config.set_main_option("script_location", str(tmp_path))
    config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    config.attributes["with_outbox"] = with_outbox
    return config


def tables_in(db: ScratchDatabase) -> set[str]:
    with db.connect() as connection:
        return {
            f"{schema}.{name}"
            for schema, name in connection.execute(
                "SELECT table_schema, table_name FROM information_schema.tables "
                "WHERE table_schema IN ('public', 'outbox')"
            )
        }


def app_revision(db: ScratchDatabase) -> str:
    with db.connect() as connection:
        row = connection.execute("SELECT version_num FROM public.alembic_version").fetchone()
    assert row is not None
    return str(row[0])


OUTBOX_TABLES = {
    "outbox.outbox",
    "outbox.outbox_dedup",
    "outbox.outbox_inbox",
    "outbox.outbox_inbox_effect",
    "outbox.outbox_alembic_version",
}
# The newest revision of the chain (re-linked when branches merge), not a literal.
HEAD = ScriptDirectory(str(outbox_migrations.SCRIPT_LOCATION)).get_current_head()


def test_upgrade_downgrade_upgrade_beside_an_application_history(
    empty_database: ScratchDatabase, tmp_path: Path
) -> None:
    command.upgrade(application_alembic(tmp_path, empty_database.url), "head")
    assert app_revision(empty_database) == "app_0001"

    engine = sa.create_engine(empty_database.url)
    try:
        with engine.begin() as connection:
            outbox_migrations.upgrade(connection)
        assert OUTBOX_TABLES | {"public.app_things", "public.alembic_version"} <= tables_in(
            empty_database
        )
        with engine.begin() as connection:
            assert outbox_migrations.current(connection) == HEAD
            outbox_migrations.downgrade(connection, "base")
        assert tables_in(empty_database) & OUTBOX_TABLES == {"outbox.outbox_alembic_version"}
        with empty_database.connect() as connection:
            assert connection.execute("SELECT count(*) FROM pg_publication").fetchone() == (0,)
        with engine.begin() as connection:
            outbox_migrations.upgrade(connection)
            assert outbox_migrations.current(connection) == HEAD
    finally:
        engine.dispose()
    assert app_revision(empty_database) == "app_0001", "the application's history is untouched"
    with empty_database.connect() as connection:
        publication = connection.execute(
            "SELECT pubinsert, pubupdate, pubdelete, pubtruncate FROM pg_publication "
            "WHERE pubname = 'outbox_publication'"
        ).fetchone()
        published = connection.execute(
            "SELECT schemaname, tablename FROM pg_publication_tables "
            "WHERE pubname = 'outbox_publication'"
        ).fetchall()
    assert publication == (True, False, False, False), "the publication publishes inserts only"
    assert sorted(published) == [("outbox", "outbox"), ("outbox", "outbox_heartbeat")]


def test_included_from_the_applications_env_py(
    empty_database: ScratchDatabase, tmp_path: Path
) -> None:
    command.upgrade(application_alembic(tmp_path, empty_database.url, with_outbox=True), "head")
    assert OUTBOX_TABLES | {"public.app_things"} <= tables_in(empty_database)
    assert app_revision(empty_database) == "app_0001"


def test_configured_schema_and_table_names(empty_database: ScratchDatabase) -> None:
    settings = OutboxSettings(
        schema_name="evt", table="events", dedup_table="events_dedup", inbox_table="events_inbox"
    )
    engine = sa.create_engine(empty_database.url)
    try:
        with engine.begin() as connection:
            outbox_migrations.upgrade(connection, settings=settings)
            assert outbox_migrations.current(connection, settings=settings) == HEAD
    finally:
        engine.dispose()
    with empty_database.connect() as connection, connection.transaction():
        Outbox(settings).publish(connection, Event("order", "1", "OrderPlaced", {}))
    with empty_database.connect() as connection:
        assert connection.execute("SELECT count(*) FROM evt.events").fetchone() == (1,)


def run_cli(*args: str, url: str) -> subprocess.CompletedProcess[str]:
    env = {"OUTBOX_DATABASE_URL": url}
    return run_outbox(*args, env=env, timeout=60)


def test_cli_upgrade_current_downgrade(empty_database: ScratchDatabase) -> None:
    url = empty_database.url
    assert run_cli("db", "current", url=url).stdout.strip() == "base"
    upgraded = run_cli("db", "upgrade", url=url)
    assert upgraded.returncode == 0, upgraded.stderr
    assert f"at revision {HEAD}" in upgraded.stdout
    assert run_cli("db", "current", url=url).stdout.strip() == HEAD
    downgraded = run_cli("db", "downgrade", "base", url=url)
    assert downgraded.returncode == 0, downgraded.stderr
    assert run_cli("db", "current", url=url).stdout.strip() == "base"


def test_cli_explains_bad_settings_without_leaking_the_password(
    empty_database: ScratchDatabase,
) -> None:
    bad_schema = run_outbox(
        "db",
        "upgrade",
        env={"OUTBOX_DATABASE_URL": empty_database.url, "OUTBOX_SCHEMA_NAME": "x;y"},
        timeout=60,
    )
    assert bad_schema.returncode == 2
    assert "OUTBOX_SCHEMA_NAME" in bad_schema.stderr
    wrong_password = empty_database.url.replace(
        empty_database.cluster.password(), "not-the-password"
    )
    unreachable = run_cli("db", "upgrade", url=wrong_password)
    assert unreachable.returncode == 2
    assert "password authentication failed" in unreachable.stderr
    assert "not-the-password" not in unreachable.stderr + unreachable.stdout
    with psycopg.connect(empty_database.conninfo) as connection:
        assert connection.execute(
            "SELECT count(*) FROM pg_namespace WHERE nspname = 'outbox'"
        ).fetchone() == (0,)


def test_keys_from_before_the_upgrade_are_read_only_for_publishers(
    empty_database: ScratchDatabase,
) -> None:
    """Keys written before row-level security have no owner (``''``) and, until
    outbox_0007, any publisher could update or delete them; a client could also write any
    owner and time. The upgrade leaves them readable (they still deduplicate) but no
    publisher's to change; converts the grants of publishers granted before it; and brings
    a time in the future (written by a client) back to now, so that the key expires."""
    from tests.integration.test_least_privilege import connect_as, drop_role, make_role

    engine = sa.create_engine(empty_database.url)
    with engine.begin() as connection:
        outbox_migrations.upgrade(connection, "outbox_0006")
    role = make_role(empty_database, "old_publisher")
    try:
        with empty_database.connect() as admin:
            admin.execute(  # outbox_0006's grant_publisher on the dedup table
                f'GRANT SELECT, INSERT, UPDATE, DELETE ON outbox.outbox_dedup TO "{role[0]}"'
            )
            admin.execute(
                "INSERT INTO outbox.outbox_dedup (dedup_key, event_id, created_at, owner) VALUES "
                "('legacy:1', gen_random_uuid(), now(), ''), "
                "('planted:1', gen_random_uuid(), '9999-01-01', '')"
            )
            admin.commit()
        with engine.begin() as connection:
            for grant in (  # the rest of outbox_0006's grant_publisher
                "GRANT USAGE ON SCHEMA outbox TO {}",
                "GRANT INSERT, SELECT (id) ON outbox.outbox TO {}",
                "GRANT USAGE ON SEQUENCE outbox.outbox_position_seq TO {}",
            ):
                connection.execute(sa.text(grant.format(f'"{role[0]}"')))
            outbox_migrations.upgrade(connection)
        with connect_as(empty_database, *role) as connection:
            assert connection.execute(
                "SELECT count(*) FROM outbox.outbox_dedup WHERE dedup_key = 'legacy:1'"
            ).fetchone() == (1,), "a key from before the upgrade is still seen"
            changed = [
                connection.execute(statement).rowcount
                for statement in (
                    "UPDATE outbox.outbox_dedup SET event_id = gen_random_uuid() WHERE owner = ''",
                    "DELETE FROM outbox.outbox_dedup WHERE owner = ''",
                )
            ]
            assert changed == [0, 0], "a publisher changed a key from before the upgrade"
            connection.commit()
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                connection.execute(
                    "INSERT INTO outbox.outbox_dedup (dedup_key, event_id, owner) "
                    "VALUES ('mine:1', gen_random_uuid(), '')"
                )
            connection.rollback()
            with connection.transaction():  # the SDK's publish with a key still works
                first = Outbox().publish(connection, Event("o", "1", "X", {}, dedup_key="k:1"))
            with connection.transaction():
                again = Outbox().publish(connection, Event("o", "1", "X", {}, dedup_key="k:1"))
            assert again.duplicate and again.event_id == first.event_id
        with empty_database.connect() as admin:
            assert admin.execute(
                "SELECT created_at <= now() FROM outbox.outbox_dedup WHERE dedup_key = 'planted:1'"
            ).fetchone() == (True,), "a key dated in the future would never expire"
        with engine.begin() as connection:  # and back: the publisher's grants as before
            outbox_migrations.downgrade(connection, "outbox_0006")
        with connect_as(empty_database, *role) as connection, connection.transaction():
            connection.execute(
                "INSERT INTO outbox.outbox_dedup (dedup_key, event_id, owner) "
                "VALUES ('mine:2', gen_random_uuid(), '')"
            )
            assert Outbox().publish(connection, Event("o", "1", "X", {}, dedup_key="k:2"))
        with engine.begin() as connection:
            outbox_migrations.upgrade(connection)
            assert outbox_migrations.current(connection) == HEAD
    finally:
        engine.dispose()
        drop_role(empty_database, role[0])


def test_cli_reads_the_database_url_from_a_file(
    empty_database: ScratchDatabase, tmp_path: Path
) -> None:
    """``--database-url-file``: the URL (and its password) stays out of the process list."""
    secret = tmp_path / "database-url"
    secret.write_text(empty_database.url + "\n")
    secret.chmod(0o600)
    upgraded = run_outbox("db", "upgrade", "--database-url-file", str(secret), timeout=60)
    assert upgraded.returncode == 0, upgraded.stderr
    now = run_outbox("db", "current", "--database-url-file", str(secret), timeout=60)
    assert now.stdout.strip() == HEAD, now.stderr
    refused = run_outbox("db", "current", "--database-url", empty_database.url, timeout=60)
    assert refused.returncode == 2
    assert "--database-url-file" in refused.stderr and "OUTBOX_DATABASE_URL" in refused.stderr
    assert empty_database.cluster.password() not in refused.stderr + refused.stdout


ALEMBIC_APP = Path(__file__).resolve().parents[2] / "examples" / "alembic_app"


def outbox_revision(database: ScratchDatabase) -> str | None:
    with database.connect() as connection:
        found = connection.execute(
            "SELECT to_regclass('outbox.outbox_alembic_version') IS NOT NULL"
        ).fetchone()
        if not found or not found[0]:
            return None
        row = connection.execute("SELECT version_num FROM outbox.outbox_alembic_version").fetchone()
        return None if row is None else str(row[0])


def test_the_documented_env_py_migrates_the_outbox_on_upgrade_only(
    empty_database: ScratchDatabase,
) -> None:
    """examples/alembic_app (the recipe of docs/application-developers.md): `alembic current`,
    `history`, `stamp` and `downgrade` leave the outbox alone; `alembic upgrade` migrates the
    application, then the outbox, on the same connection."""

    def alembic(*args: str) -> str:
        result = subprocess.run(
            [sys.executable, "-m", "alembic", "-c", str(ALEMBIC_APP / "alembic.ini"), *args],
            env={**os.environ, "OUTBOX_DATABASE_URL": empty_database.url},
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert result.returncode == 0, result.stderr[-3000:]
        return result.stdout

    head = ScriptDirectory(str(outbox_migrations.SCRIPT_LOCATION)).get_current_head()
    alembic("current")
    assert outbox_revision(empty_database) is None, "`alembic current` migrated the outbox"
    alembic("upgrade", "head")
    assert outbox_revision(empty_database) == head
    assert "app_0001 (head)" in alembic("current")
    alembic("downgrade", "base")
    assert outbox_revision(empty_database) == head, "the application's downgrade is its own"
    with empty_database.connect() as connection:
        row = connection.execute("SELECT to_regclass('public.orders') IS NULL").fetchone()
        assert row == (True,)
    alembic("stamp", "head")
    alembic("upgrade", "head")  # nothing of the application's left to run: the outbox's ran
    assert outbox_revision(empty_database) == head
