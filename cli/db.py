"""``outbox db``: the outbox's own Alembic migrations (own version table)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

from cli._common import friendly_errors, load

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

app = typer.Typer(
    help="Create, upgrade or remove the outbox tables and publication (Alembic).",
    no_args_is_help=True,
)

DATABASE_URL_HELP = (
    "SQLAlchemy URL of the database; default: the OUTBOX_DATABASE_URL environment variable."
)


def _engine(database_url: str | None) -> Engine:
    from sqlalchemy import create_engine

    from outbox.settings import DatabaseSettings

    if database_url is None:
        database_url = load(DatabaseSettings).database_url.get_secret_value()
    return create_engine(database_url)


@app.command()
def upgrade(
    revision: str = typer.Argument("head", help="Target revision."),
    database_url: str | None = typer.Option(None, "--database-url", help=DATABASE_URL_HELP),
) -> None:
    """Upgrade the outbox objects to REVISION (default: the newest)."""
    import migrations
    from outbox.settings import OutboxSettings

    settings = load(OutboxSettings)
    engine = _engine(database_url)
    with friendly_errors(), engine.begin() as connection:
        migrations.upgrade(connection, revision, settings=settings)
        now = migrations.current(connection, settings=settings)
    engine.dispose()
    typer.echo(f"outbox schema {settings.schema_name!r} at revision {now}")


@app.command()
def downgrade(
    revision: str = typer.Argument(..., help="Target revision; 'base' removes everything."),
    database_url: str | None = typer.Option(None, "--database-url", help=DATABASE_URL_HELP),
) -> None:
    """Downgrade the outbox objects to REVISION. 'base' drops the tables and their rows."""
    import migrations
    from outbox.settings import OutboxSettings

    settings = load(OutboxSettings)
    engine = _engine(database_url)
    with friendly_errors(), engine.begin() as connection:
        migrations.downgrade(connection, revision, settings=settings)
        now = migrations.current(connection, settings=settings)
    engine.dispose()
    typer.echo(f"outbox schema {settings.schema_name!r} at revision {now or 'base'}")


@app.command()
def current(
    database_url: str | None = typer.Option(None, "--database-url", help=DATABASE_URL_HELP),
) -> None:
    """Print the applied outbox revision ('base' when none)."""
    import migrations
    from outbox.settings import OutboxSettings

    settings = load(OutboxSettings)
    engine = _engine(database_url)
    with friendly_errors(), engine.connect() as connection:
        now = migrations.current(connection, settings=settings)
    engine.dispose()
    typer.echo(now or "base")


@app.command()
def grant(
    role: str = typer.Argument(..., help="An existing database role (a plain identifier)."),
    publisher: bool = typer.Option(False, "--publisher", help="Allow it to publish events."),
    consumer: bool = typer.Option(False, "--consumer", help="Allow it to claim inbox messages."),
    database_url: str | None = typer.Option(None, "--database-url", help=DATABASE_URL_HELP),
) -> None:
    """Grant ROLE the least privileges to publish events and/or consume them idempotently."""
    import migrations
    from outbox.settings import OutboxSettings

    if not (publisher or consumer):
        typer.secho("choose --publisher, --consumer or both", err=True, fg="red")
        raise typer.Exit(2)
    settings = load(OutboxSettings)
    engine = _engine(database_url)
    with friendly_errors(), engine.begin() as connection:
        if publisher:
            migrations.grant_publisher(connection, role, settings=settings)
        if consumer:
            migrations.grant_consumer(connection, role, settings=settings)
    engine.dispose()
    granted = " and ".join(
        name for name, chosen in (("publisher", publisher), ("consumer", consumer)) if chosen
    )
    typer.echo(f"granted {granted} privileges to {role}")
