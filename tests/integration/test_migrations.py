"""Migrations: own version table, beside an application's own Alembic history."""

from __future__ import annotations

import subprocess
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
