"""``outbox connect``: the Debezium connector of the CDC path, through Connect's REST API."""

from __future__ import annotations

import typer

from outbox_cli._common import kafka_settings, load
from outbox_connect.open_transactions import IDLE_SECONDS

app = typer.Typer(help="Apply and watch the Debezium connector (CDC path).", no_args_is_help=True)


@app.command()
def apply(
    wait: bool = typer.Option(True, help="Wait until the connector and its task run."),
) -> None:
    """Create or update the connector from connect/outbox_connect/outbox-connector.json.
    Idempotent."""
    from outbox.settings import OutboxSettings
    from outbox_connect import ConnectClient, ConnectorSettings, render_connector_config

    settings = load(ConnectorSettings)
    config = render_connector_config(settings, load(OutboxSettings))
    client = ConnectClient(settings.url)
    changed = client.apply(settings.name, config)
    if wait:
        client.wait_running(settings.name)
    typer.echo(f"connector {settings.name}: {'applied' if changed else 'unchanged'}")


@app.command()
def status() -> None:
    """Connector and task states; transactions left open on Connect's offsets topic; the
    replication slot's state, retained WAL (lag) in bytes, and PostgreSQL's
    max_slot_wal_keep_size with a recommendation.

    The slot report needs OUTBOX_DATABASE_URL. Exit 1 unless everything runs and no hanging
    transaction holds Connect's offsets topic.
    """
    import os

    from outbox.core.errors import OutboxError
    from outbox_connect import ConnectClient, ConnectorSettings
    from outbox_connect.open_transactions import open_transactions

    settings = load(ConnectorSettings)
    state = ConnectClient(settings.url).state(settings.name)
    if state is None:
        typer.echo(f"connector {settings.name}: not created (run `outbox connect apply`)")
    else:
        typer.echo(f"connector {settings.name}: {state.connector}")
        for task, task_state, trace in state.tasks:
            typer.echo(f"  task {task}: {task_state}")
            if trace:
                typer.echo("    " + trace.splitlines()[0][:300])
    # Checked whatever the connector's state: a worker held by a hanging transaction
    # answers REST yet lists no connector.
    try:
        held = open_transactions(kafka_settings(), settings.offsets_topic)
    except OutboxError as error:  # Connect may be up while the broker is not
        typer.echo(f"offsets topic {settings.offsets_topic}: not checked ({error})")
        held = []
    else:
        if not held:
            typer.echo(f"offsets topic {settings.offsets_topic}: no transaction left open")
        for transaction in held:
            typer.echo(transaction.describe())
    hanging = any(transaction.hanging for transaction in held)
    if hanging:
        typer.echo(
            "  a hanging transaction holds every exactly-once worker at start-up: abort it "
            "with `outbox connect unblock` (loses nothing; each line above says whether it "
            "re-delivers)"
        )
    if os.environ.get("OUTBOX_DATABASE_URL"):
        for line in _slot_report(settings.slot_name):
            typer.echo(line)
    if state is None or not state.running or hanging:
        raise typer.Exit(1)


@app.command()
def restart() -> None:
    """Restart the connector and all its tasks (Debezium resumes from its stored offsets)."""
    from outbox_connect import ConnectClient, ConnectorSettings

    settings = load(ConnectorSettings)
    client = ConnectClient(settings.url)
    client.restart(settings.name)
    state = client.wait_running(settings.name)
    typer.echo(f"connector {settings.name}: {state.connector}")


@app.command()
def unblock(
    idle_seconds: float = typer.Option(
        IDLE_SECONDS,
        min=0,
        help="Abort only transactions whose producer has been silent this long.",
    ),
) -> None:
    """Abort the hanging transactions on Connect's offsets topic (OUTBOX_CONNECT_OFFSETS_TOPIC):
    those no transaction coordinator counts as open, which Kafka never ends by itself and
    which hold an exactly-once worker at start-up (it answers REST but starts no connector).
    Loses nothing: the task resumes from the last offsets its readers see committed; one its
    coordinator recorded committed (the marker never came) is re-delivered, and each line
    says so. Transactions a coordinator still owns are left to it
    (it aborts them after their timeout). Exit 1 if a hanging one remains."""
    from outbox_connect import ConnectorSettings
    from outbox_connect.open_transactions import unblock as unblock_topic

    settings = load(ConnectorSettings)
    aborted, left = unblock_topic(
        kafka_settings(), settings.offsets_topic, idle_seconds=idle_seconds
    )
    for transaction in aborted:
        typer.echo(f"aborted: {transaction.describe()}")
    for transaction in left:
        typer.echo(f"still open: {transaction.describe()}")
        if transaction.hanging:
            typer.echo(
                f"  silent less than {transaction.silence_needed(idle_seconds):g} s: run "
                "again later, or with a lower --idle-seconds"
            )
    if not aborted and not left:
        typer.echo(f"offsets topic {settings.offsets_topic}: no transaction left open")
    if any(transaction.hanging for transaction in left):
        raise typer.Exit(1)


def _slot_report(slot: str) -> list[str]:
    """The slot's state and lag, and what bounds the WAL it keeps (with a recommendation)."""
    from sqlalchemy import create_engine, text

    from outbox.settings import DatabaseSettings

    engine = create_engine(load(DatabaseSettings).database_url.get_secret_value())
    try:
        with engine.connect() as connection:
            row = connection.execute(
                text(
                    "SELECT CASE WHEN active THEN 'active' ELSE 'inactive' END, "
                    "pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::bigint, "
                    "coalesce(wal_status, 'unknown') "
                    "FROM pg_replication_slots WHERE slot_name = :slot"
                ),
                {"slot": slot},
            ).first()
            keep = str(connection.execute(text("SHOW max_slot_wal_keep_size")).scalar_one())
    finally:
        engine.dispose()
    lines = [
        f"slot {slot}: missing"
        if row is None
        else f"slot {slot}: {row[0]}, retained WAL {int(row[1] or 0):,} bytes, wal_status {row[2]}"
    ]
    if keep in {"-1", "-1kB", "-1MB"}:
        lines.append(
            "max_slot_wal_keep_size: unlimited. A stopped connector keeps WAL until the disk "
            "is full and PostgreSQL stops. Recommended: a bound the disk can hold, e.g. "
            "ALTER SYSTEM SET max_slot_wal_keep_size = '10GB'; SELECT pg_reload_conf(); "
            "past it the slot is invalidated (wal_status 'lost'): recreate the connector, "
            "and run the relay in auto mode so that no event waits meanwhile"
        )
    else:
        lines.append(
            f"max_slot_wal_keep_size: {keep} (past it the slot is invalidated: "
            "recreate the connector; the relay in auto mode publishes meanwhile)"
        )
    return lines
