"""``outbox db``: the outbox's own Alembic migrations (own version table), and grants."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from outbox.core.errors import ConfigurationError
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
    help="SQLAlchemy URL of the database, without a password (the command line is visible to "
    "every user of the machine); default: the OUTBOX_DATABASE_URL environment variable.",
)
DATABASE_URL_FILE_OPTION = typer.Option(
    None,
    "--database-url-file",
    help="A file that holds the database URL (with its password): readable by you only.",
    dir_okay=False,
)


CONSUMER_NAME_OPTION = typer.Option(
    None,
    "--consumer-name",
    help="With --consumer: an inbox consumer name this role may use (repeat for several); "
    "default: the role's name. Other roles cannot read, delete or claim its messages.",
)

AGGREGATE_TYPE_OPTION = typer.Option(
    None,
    "--aggregate-type",
    help="With --publisher: an aggregate type this role may publish (repeat for several). "
    "The database refuses its events of any other type and hides other types' rows.",
)
ANY_AGGREGATE_TYPE_OPTION = typer.Option(
    False,
    "--any-aggregate-type",
    help="With --publisher: every aggregate type (as every publisher could before "
    "outbox_0008). Prefer --aggregate-type: one service cannot then write another's events.",
)

REVOKED_TYPE_OPTION = typer.Option(
    None, "--aggregate-type", help="An aggregate type it may no longer publish (repeat)."
)
REVOKED_ANY_TYPE_OPTION = typer.Option(
    False, "--any-aggregate-type", help="Take away 'every type' (keeps the types named)."
)


def database_url_of(url: str | None, url_file: Path | None) -> str:
    """The database URL: from ``--database-url-file``, from ``--database-url`` when it
    holds no password, else OUTBOX_DATABASE_URL. A password on the command line is refused
    (before anything connects): every user of the machine can read it there (``ps``)."""
    from outbox.settings import DatabaseSettings

    if url is not None and url_file is not None:
        raise ConfigurationError("give --database-url or --database-url-file, not both")
    if url_file is not None:
        url = url_file.read_text(encoding="utf-8").strip()
        where = f"--database-url-file {url_file}"
        if not url:
            raise ConfigurationError(f"{where}: the file is empty")
    elif url is not None:
        where = "--database-url"
        if _has_password(url):
            raise ConfigurationError(
                "--database-url holds a password, which every user of this machine can read "
                "in the process list: set OUTBOX_DATABASE_URL instead, or put the URL in a "
                "file only you can read and give --database-url-file PATH"
            )
    else:
        return load(DatabaseSettings).database_url.get_secret_value()
    from outbox import sqlalchemy_url

    try:
        return sqlalchemy_url(url)
    except ConfigurationError as error:
        raise ConfigurationError(f"{where}: {error}") from None


def _has_password(url: str) -> bool:
    """A password in the URL's authority (``user:password@``) or its query
    (``?password=``, which libpq reads too)."""
    from urllib.parse import parse_qs, urlsplit

    try:
        parts = urlsplit(url)
    except ValueError:  # not a URL that can be read: it may hold anything
        return True
    return bool(parts.password) or any(key.lower() == "password" for key in parse_qs(parts.query))


@contextmanager
def _database(
    database_url: str | None, database_url_file: Path | None = None
) -> Iterator[tuple[Connection, OutboxSettings]]:
    """One connection in one transaction (committed on success), and the outbox settings."""
    from sqlalchemy import create_engine

    from outbox.settings import OutboxSettings

    settings = load(OutboxSettings)
    engine = create_engine(database_url_of(database_url, database_url_file))
    try:
        with engine.begin() as connection:
            yield connection, settings
    finally:
        engine.dispose()


@app.command()
def upgrade(
    revision: str = typer.Argument("head", help="Target revision."),
    database_url: str | None = DATABASE_URL_OPTION,
    database_url_file: Path | None = DATABASE_URL_FILE_OPTION,
) -> None:
    """Upgrade the outbox objects to REVISION (default: the newest)."""
    import outbox_migrations

    with _database(database_url, database_url_file) as (connection, settings):
        outbox_migrations.upgrade(connection, revision, settings=settings)
        now = outbox_migrations.current(connection, settings=settings)
    typer.echo(f"outbox schema {settings.schema_name!r} at revision {now}")


@app.command()
def downgrade(
    revision: str = typer.Argument(..., help="Target revision; 'base' removes everything."),
    database_url: str | None = DATABASE_URL_OPTION,
    database_url_file: Path | None = DATABASE_URL_FILE_OPTION,
) -> None:
    """Downgrade the outbox objects to REVISION. 'base' drops the tables and their rows."""
    import outbox_migrations

    with _database(database_url, database_url_file) as (connection, settings):
        outbox_migrations.downgrade(connection, revision, settings=settings)
        now = outbox_migrations.current(connection, settings=settings)
    typer.echo(f"outbox schema {settings.schema_name!r} at revision {now or 'base'}")


@app.command()
def current(
    database_url: str | None = DATABASE_URL_OPTION,
    database_url_file: Path | None = DATABASE_URL_FILE_OPTION,
) -> None:
    """Print the applied outbox revision ('base' when none)."""
    import outbox_migrations

    with _database(database_url, database_url_file) as (connection, settings):
        now = outbox_migrations.current(connection, settings=settings)
    typer.echo(now or "base")


@app.command()
def grant(
    role: str = typer.Argument(..., help="An existing database role (a plain identifier)."),
    publisher: bool = typer.Option(False, "--publisher", help="Allow it to publish events."),
    consumer: bool = typer.Option(False, "--consumer", help="Allow it to claim inbox messages."),
    relay: bool = typer.Option(False, "--relay", help="Allow it to run the polling relay."),
    consumer_names: list[str] | None = CONSUMER_NAME_OPTION,
    aggregate_types: list[str] | None = AGGREGATE_TYPE_OPTION,
    any_aggregate_type: bool = ANY_AGGREGATE_TYPE_OPTION,
    database_url: str | None = DATABASE_URL_OPTION,
    database_url_file: Path | None = DATABASE_URL_FILE_OPTION,
) -> None:
    """Grant ROLE the least privileges to publish events, consume them idempotently, or relay.

    A publisher publishes only the aggregate types named here (added to those it holds)."""
    import outbox_migrations

    chosen = {"publisher": publisher, "consumer": consumer, "relay": relay}
    if not any(chosen.values()):
        typer.secho("choose --publisher, --consumer, --relay or several", err=True, fg="red")
        raise typer.Exit(2)
    if consumer_names and not consumer:
        typer.secho("--consumer-name goes with --consumer", err=True, fg="red")
        raise typer.Exit(2)
    if (aggregate_types or any_aggregate_type) and not publisher:
        typer.secho(
            "--aggregate-type and --any-aggregate-type go with --publisher", err=True, fg="red"
        )
        raise typer.Exit(2)
    if publisher and not aggregate_types and not any_aggregate_type:
        raise ConfigurationError(
            "name the aggregate types ROLE publishes: --aggregate-type T (repeat it), "
            "or --any-aggregate-type to allow every type"
        )
    with _database(database_url, database_url_file) as (connection, settings):
        if publisher:
            outbox_migrations.grant_publisher(
                connection,
                role,
                aggregate_types=aggregate_types or (),
                any_aggregate_type=any_aggregate_type,
                settings=settings,
            )
        if consumer:
            outbox_migrations.grant_consumer(
                connection, role, consumers=consumer_names or (), settings=settings
            )
        if relay:
            outbox_migrations.grant_relay(connection, role, settings=settings)
    granted = " and ".join(name for name, wanted in chosen.items() if wanted)
    typer.echo(f"granted {granted} privileges to {role}")


@app.command()
def revoke(
    role: str = typer.Argument(..., help="A role granted --publisher."),
    aggregate_types: list[str] | None = REVOKED_TYPE_OPTION,
    any_aggregate_type: bool = REVOKED_ANY_TYPE_OPTION,
    database_url: str | None = DATABASE_URL_OPTION,
    database_url_file: Path | None = DATABASE_URL_FILE_OPTION,
) -> None:
    """Take aggregate types away from a publisher role; print the types it still holds."""
    import outbox_migrations

    if not aggregate_types and not any_aggregate_type:
        typer.secho("name what to revoke: --aggregate-type T or --any-aggregate-type", err=True)
        raise typer.Exit(2)
    with _database(database_url, database_url_file) as (connection, settings):
        left = outbox_migrations.revoke_publisher(
            connection,
            role,
            aggregate_types=aggregate_types or (),
            any_aggregate_type=any_aggregate_type,
            settings=settings,
        )
    typer.echo(f"{role} publishes: {', '.join(left) if left else 'nothing'}")


@app.command("cdc-role")
def cdc_role(
    role: str | None = typer.Argument(
        None, help="Role name; default: OUTBOX_CONNECT_DATABASE_USER (outbox_cdc)."
    ),
    database_url: str | None = DATABASE_URL_OPTION,
    database_url_file: Path | None = DATABASE_URL_FILE_OPTION,
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
    with _database(database_url, database_url_file) as (connection, settings):
        outbox_migrations.create_cdc_role(connection, name, password, settings=settings)
    typer.echo(f"CDC role {name}: LOGIN REPLICATION, SELECT on {settings.tables.qualified_outbox}")


@app.command("relay-role")
def relay_role(
    role: str = typer.Argument("outbox_relay", help="Role name (a plain identifier)."),
    database_url: str | None = DATABASE_URL_OPTION,
    database_url_file: Path | None = DATABASE_URL_FILE_OPTION,
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
    with _database(database_url, database_url_file) as (connection, settings):
        outbox_migrations.create_relay_role(connection, role, password, settings=settings)
    typer.echo(f"relay role {role}: LOGIN, read/delete on {settings.tables.qualified_outbox}")


TYPES_ARGUMENT = typer.Argument(None, help="Aggregate types, e.g. order.line.")


@app.command("register-types")
def register_types(
    aggregate_types: list[str] | None = TYPES_ARGUMENT,
    from_kafka: bool = typer.Option(
        False,
        "--from-kafka",
        help="Also every aggregate type with a topic (outbox.event.<type>) on the broker "
        "(OUTBOX_KAFKA_BOOTSTRAP_SERVERS, else the local stack's).",
    ),
    database_url: str | None = DATABASE_URL_OPTION,
    database_url_file: Path | None = DATABASE_URL_FILE_OPTION,
) -> None:
    """Register aggregate types in the topic registry, so that a type whose topic would
    collide with theirs on Kafka (order_line, order.line) is refused when published.

    For types delivered before the registry knew them (`outbox db upgrade` registers the ones
    the database has a trace of). Run it as the owner of the outbox objects. Exit 2 when a
    type collides with a registered one (both topics exist: one type's records fail).
    """
    import outbox_migrations

    types = list(aggregate_types or [])
    if from_kafka:
        from outbox_cli.relay import aggregate_types_on_kafka

        try:
            types += aggregate_types_on_kafka()
        except ModuleNotFoundError as error:  # kafka-python: the relay's extra
            if error.name != "kafka":
                raise
            raise ConfigurationError(
                "--from-kafka needs kafka-python: pip install 'outbox-relay[relay]'"
            ) from error
    if not types:
        typer.secho("give aggregate types, or --from-kafka", err=True, fg="red")
        raise typer.Exit(2)
    with _database(database_url, database_url_file) as (connection, settings):
        done = outbox_migrations.register_types(connection, types, settings=settings)
    typer.echo(f"{len(done.registered)} type(s) registered: {' '.join(done.registered)}")
    typer.echo(f"{len(done.known)} already registered")
    for invalid in done.invalid:
        typer.secho(f"not an aggregate type, skipped: {invalid!r}", err=True, fg="yellow")
    for aggregate_type, holder in done.collisions:
        typer.secho(
            f"{aggregate_type} collides with the registered type {holder} (Kafka treats '.' "
            "and '_' alike): the records of one of them cannot be delivered",
            err=True,
            fg="red",
        )
    if done.collisions:
        raise typer.Exit(2)


@app.command()
def expire(
    dead_letters_days: float | None = typer.Option(
        None,
        "--dead-letters-days",
        min=0.01,
        help="Delete consumers' dead letters older than this (default: "
        "OUTBOX_DEAD_LETTER_RETENTION; the relay's stay until replayed or discarded: "
        "`outbox relay dead-letters`).",
    ),
    database_url: str | None = DATABASE_URL_OPTION,
    database_url_file: Path | None = DATABASE_URL_FILE_OPTION,
) -> None:
    """Delete expired rows: dedup keys (OUTBOX_DEDUP_WINDOW), inbox claims
    (OUTBOX_INBOX_RETENTION), consumers' dead letters (OUTBOX_DEAD_LETTER_RETENTION, 30 days,
    or --dead-letters-days), done side-effect steps (the longer of the inbox's and the dead
    letters' retention), heartbeat rows (1 hour). Never the relay's dead letters: events not
    yet published.

    Run it on a schedule (hourly, say) as the owner of the outbox objects.
    """
    from datetime import timedelta

    from outbox_migrations.retention import expire as expire_rows

    dead_letters = None if dead_letters_days is None else timedelta(days=dead_letters_days)
    with _database(database_url, database_url_file) as (connection, settings):
        deleted = expire_rows(connection, settings=settings, dead_letters=dead_letters)
    for table, count in deleted.items():
        typer.echo(f"{table}: {count} expired row(s) deleted")
