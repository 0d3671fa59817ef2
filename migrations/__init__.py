"""Alembic migrations of the outbox, dedup and inbox tables and the CDC publication.

They keep their own version table (``outbox_alembic_version`` in the outbox schema), so they
live beside an application's own Alembic history without touching it. Run them with the CLI
(``outbox db upgrade``), or from code, for example at the end of your own ``env.py``::

    import migrations as outbox_migrations
    outbox_migrations.upgrade(connection)        # a SQLAlchemy Connection

Schema and names come from :class:`outbox.OutboxSettings` (``OUTBOX_*`` variables).
"""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from sqlalchemy.engine import Connection

from outbox.settings import OutboxSettings

__all__ = ["VERSION_TABLE", "alembic_config", "current", "downgrade", "upgrade"]

VERSION_TABLE = "outbox_alembic_version"
SCRIPT_LOCATION = Path(__file__).resolve().parent


def alembic_config(
    *,
    connection: Connection | None = None,
    url: str | None = None,
    settings: OutboxSettings | None = None,
) -> Config:
    """An Alembic ``Config`` for these migrations, on ``connection`` or ``url``."""
    config = Config()
    config.set_main_option("script_location", str(SCRIPT_LOCATION))
    config.attributes["outbox_settings"] = settings if settings is not None else OutboxSettings()
    if connection is not None:
        config.attributes["connection"] = connection
    if url is not None:
        config.attributes["url"] = url
    return config


def upgrade(
    connection: Connection, revision: str = "head", *, settings: OutboxSettings | None = None
) -> None:
    """Upgrade the outbox objects to ``revision`` on ``connection`` (the caller commits)."""
    command.upgrade(alembic_config(connection=connection, settings=settings), revision)


def downgrade(
    connection: Connection, revision: str, *, settings: OutboxSettings | None = None
) -> None:
    """Downgrade the outbox objects to ``revision`` (``base`` removes them all)."""
    command.downgrade(alembic_config(connection=connection, settings=settings), revision)


def current(connection: Connection, *, settings: OutboxSettings | None = None) -> str | None:
    """The applied revision, or None when the outbox objects were never created."""
    settings = settings if settings is not None else OutboxSettings()
    context = MigrationContext.configure(
        connection,
        opts={"version_table": VERSION_TABLE, "version_table_schema": settings.schema_name},
    )
    return context.get_current_revision()
