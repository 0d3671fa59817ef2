"""``outbox db``: the outbox's own Alembic migrations (own version table), and grants."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import typer

from outbox_cli._common import load

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection

    from outbox.settings import OutboxSettings

app = typer.Typer(
    help="Create, upgrade or remove the outbox tables and publication (Alembic).",
    no_args_is_help=True,
)

DATABASE_URL_OPTION = typer.Option(
    None,
    "--database-url",
    help="SQLAlchemy URL of the database; default: the OUTBOX_DATABASE_URL environment variable.",
)


CONSUMER_NAME_OPTION = typer.Option(
    None,
    "--consumer-name",
    help="With --consumer: an inbox consumer name this role may use (repeat for several); "
    "default: the role's name. Other roles cannot read, delete or claim its messages.",
)


@contextmanager
def _database(database_url: str | None) -> Iterator[tuple[Connection, OutboxSettings]]:
    """One connection in one transaction (committed on success), and the outbox settings."""
    from sqlalchemy import create_engine

    from outbox.settings import DatabaseSettings, OutboxSettings

    settings = load(OutboxSettings)
    if database_url is None:
        database_url = load(DatabaseSettings).database_url.get_secret_value()
    engine = create_engine(database_url)
    try:
        with engine.begin() as connection:
            yield connection, settings
    finally:
        engine.dispose()


@app.command()
def upgrade(
    revision: str = typer.Argument("head", help="Target revision."),
    database_url: str | None = DATABASE_URL_OPTION,
) -> None:
    """Upgrade the outbox objects to REVISION (default: the newest)."""
    import outbox_migrations

    with _database(database_url) as (connection, settings):
        outbox_migrations.upgrade(connection, revision, settings=settings)
        now = outbox_migrations.current(connection, settings=settings)
    typer.echo(f"outbox schema {settings.schema_name!r} at revision {now}")


@app.command()
def downgrade(
    revision: str = typer.Argument(..., help="Target revision; 'base' removes everything."),
    database_url: str | None = DATABASE_URL_OPTION,
) -> None:
    """Downgrade the outbox objects to REVISION. 'base' drops the tables and their rows."""
    import outbox_migrations

    with _database(database_url) as (connection, settings):
        outbox_migrations.downgrade(connection, revision, settings=settings)
        now = outbox_migrations.current(connection, settings=settings)
    typer.echo(f"outbox schema {settings.schema_name!r} at revision {now or 'base'}")


@app.command()
def current(database_url: str | None = DATABASE_URL_OPTION) -> None:
    """Print the applied outbox revision ('base' when none)."""
    import outbox_migrations

    with _database(database_url) as (connection, settings):
        now = outbox_migrations.current(connection, settings=settings)
    typer.echo(now or "base")


@app.command()
def grant(
    role: str = typer.Argument(..., help="An existing database role (a plain identifier)."),
    publisher: bool = typer.Option(False, "--publisher", help="Allow it to publish events."),
    consumer: bool = typer.Option(False, "--consumer", help="Allow it to claim inbox messages."),
    relay: bool = typer.Option(False, "--relay", help="Allow it to run the polling relay."),
    consumer_names: list[str] | None = CONSUMER_NAME_OPTION,
    database_url: str | None = DATABASE_URL_OPTION,
) -> None:
    """Grant ROLE the least privileges to publish events, consume them idempotently, or relay."""
    import outbox_migrations

    chosen = {"publisher": publisher, "consumer": consumer, "relay": relay}
    if not any(chosen.values()):
        typer.secho("choose --publisher, --consumer, --relay or several", err=True, fg="red")
        raise typer.Exit(2)
    if consumer_names and not consumer:
        typer.secho("--consumer-name goes with --consumer", err=True, fg="red")
        raise typer.Exit(2)
    with _database(database_url) as (connection, settings):
        if publisher:
            outbox_migrations.grant_publisher(connection, role, settings=settings)
        if consumer:
            outbox_migrations.grant_consumer(
                connection, role, consumers=consumer_names or (), settings=settings
            )
        if relay:
            outbox_migrations.grant_relay(connection, role, settings=settings)
    granted = " and ".join(name for name, wanted in chosen.items() if wanted)
    typer.echo(f"granted {granted} privileges to {role}")


@app.command("cdc-role")
def cdc_role(
    role: str | None = typer.Argument(
        None, help="Role name; default: OUTBOX_CONNECT_DATABASE_USER (outbox_cdc)."
    ),
    database_url: str | None = DATABASE_URL_OPTION,
) -> None:
    """Create or update the role Debezium connects as: LOGIN REPLICATION, SELECT on the outbox.

    Its password is OUTBOX_CONNECT_DATABASE_PASSWORD (never printed). Run it as a role
    that may create roles, after `outbox db upgrade`.
    """
    import outbox_migrations
    from outbox_connect.settings import ConnectorSettings

    connector = load(ConnectorSettings)
    name = role or connector.database_user
    password = connector.database_password.get_secret_value()
    if not password:
        typer.secho(
            "set OUTBOX_CONNECT_DATABASE_PASSWORD to the CDC role's password "
            '(the local stack: eval "$(outbox stack env)")',
            err=True,
            fg="red",
        )
        raise typer.Exit(2)
    with _database(database_url) as (connection, settings):
        outbox_migrations.create_cdc_role(connection, name, password, settings=settings)
    typer.echo(f"CDC role {name}: LOGIN REPLICATION, SELECT on {settings.tables.qualified_outbox}")


@app.command("relay-role")
def relay_role(
    role: str = typer.Argument("outbox_relay", help="Role name (a plain identifier)."),
    database_url: str | None = DATABASE_URL_OPTION,
) -> None:
    """Create or update the role the polling relay connects as: LOGIN, relay grants only.

    Its password is OUTBOX_RELAY_DATABASE_PASSWORD (never printed). Run it as a role that
    may create roles, after `outbox db upgrade`.
    """
    import outbox_migrations
    from outbox_relay.settings import RelaySettings

    password = load(RelaySettings).database_password.get_secret_value()
    if not password:
        typer.secho(
            "set OUTBOX_RELAY_DATABASE_PASSWORD to the relay role's password", err=True, fg="red"
        )
        raise typer.Exit(2)
    with _database(database_url) as (connection, settings):
        outbox_migrations.create_relay_role(connection, role, password, settings=settings)
    typer.echo(f"relay role {role}: LOGIN, read/delete on {settings.tables.qualified_outbox}")


@app.command()
def expire(
    dead_letters_days: float = typer.Option(
        30,
        "--dead-letters-days",
        min=0.01,
        help="Delete consumers' dead letters older than this (the relay's stay until "
        "replayed or discarded: `outbox relay dead-letters`).",
    ),
    database_url: str | None = DATABASE_URL_OPTION,
) -> None:
    """Delete expired rows: dedup keys (OUTBOX_DEDUP_WINDOW), inbox claims and done
    side-effect steps (OUTBOX_INBOX_RETENTION), consumers' dead letters (--dead-letters-days),
    heartbeat rows (1 hour). Never the relay's dead letters: events not yet published.

    Run it on a schedule (hourly, say) as the owner of the outbox objects.
    """
    from datetime import timedelta

    from outbox_migrations.retention import expire as expire_rows

    with _database(database_url) as (connection, settings):
        deleted = expire_rows(
            connection, settings=settings, dead_letters=timedelta(days=dead_letters_days)
        )
    for table, count in deleted.items():
        typer.echo(f"{table}: {count} expired row(s) deleted")
