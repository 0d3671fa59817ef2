"""Alembic environment of the outbox migrations: own version table, in the outbox schema."""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine, text
from sqlalchemy.engine import Connection

from migrations import VERSION_TABLE
from outbox.settings import DatabaseSettings, OutboxSettings


def _run(connection: Connection, settings: OutboxSettings) -> None:
    schema = settings.tables.quoted_schema
    connection.execute(text(f"CREATE SCHEMA IF NOT EXISTS {schema}"))
    context.configure(
        connection=connection,
        version_table=VERSION_TABLE,
        version_table_schema=settings.schema_name,
        transaction_per_migration=False,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    attributes = context.config.attributes
    settings: OutboxSettings = attributes.get("outbox_settings") or OutboxSettings()
    connection: Connection | None = attributes.get("connection")
    if connection is not None:
        _run(connection, settings)
        return
    url = attributes.get("url") or DatabaseSettings().database_url.get_secret_value()  # type: ignore[call-arg]
    engine = create_engine(url)
    try:
        with engine.begin() as own_connection:
            _run(own_connection, settings)
    finally:
        engine.dispose()


if context.is_offline_mode():
    raise SystemExit("offline (--sql) mode is not supported by the outbox migrations")
run_migrations_online()
