"""``outbox connect``: the Debezium connector of the CDC path, through Connect's REST API."""

from __future__ import annotations

import typer

from outbox_cli._common import load

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
    """Connector and task states; the replication slot's state, retained WAL (lag) in bytes,
    and PostgreSQL's max_slot_wal_keep_size with a recommendation.

    The slot report needs OUTBOX_DATABASE_URL. Exit 1 unless everything runs.
    """
    import os

    from outbox_connect import ConnectClient, ConnectorSettings

    settings = load(ConnectorSettings)
    state = ConnectClient(settings.url).state(settings.name)
    if state is None:
        typer.echo(f"connector {settings.name}: not created (run `outbox connect apply`)")
        raise typer.Exit(1)
    typer.echo(f"connector {settings.name}: {state.connector}")
    for task, task_state, trace in state.tasks:
        typer.echo(f"  task {task}: {task_state}")
        if trace:
            typer.echo("    " + trace.splitlines()[0][:300])
    if os.environ.get("OUTBOX_DATABASE_URL"):
        for line in _slot_report(settings.slot_name):
            typer.echo(line)
    if not state.running:
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
