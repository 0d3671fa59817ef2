"""``outbox connect``: the Debezium connector of the CDC path, through Connect's REST API."""

from __future__ import annotations

import typer

from cli._common import load

app = typer.Typer(help="Apply and watch the Debezium connector (CDC path).", no_args_is_help=True)


@app.command()
def apply(
    wait: bool = typer.Option(True, help="Wait until the connector and its task run."),
) -> None:
    """Create or update the connector from connect/outbox-connector.json. Idempotent."""
    from connect import ConnectClient, ConnectorSettings, render_connector_config
    from outbox.settings import OutboxSettings

    settings = load(ConnectorSettings)
    config = render_connector_config(settings, load(OutboxSettings))
    client = ConnectClient(settings.url)
    changed = client.apply(settings.name, config)
    if wait:
        client.wait_running(settings.name)
    typer.echo(f"connector {settings.name}: {'applied' if changed else 'unchanged'}")


@app.command()
def status() -> None:
    """Connector and task states, and the replication slot's retained WAL (lag) in bytes.

    The lag needs OUTBOX_DATABASE_URL. Exit 1 unless everything runs.
    """
    import os

    from connect import ConnectClient, ConnectorSettings

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
        lag = _slot_lag(settings.slot_name)
        typer.echo(
            f"slot {settings.slot_name}: "
            + ("missing" if lag is None else f"{lag[0]}, retained WAL {lag[1]:,} bytes")
        )
    if not state.running:
        raise typer.Exit(1)


@app.command()
def restart() -> None:
    """Restart the connector and its failed tasks."""
    from connect import ConnectClient, ConnectorSettings

    settings = load(ConnectorSettings)
    client = ConnectClient(settings.url)
    client.restart(settings.name)
    state = client.wait_running(settings.name)
    typer.echo(f"connector {settings.name}: {state.connector}")


def _slot_lag(slot: str) -> tuple[str, int] | None:
    from sqlalchemy import create_engine, text

    from outbox.settings import DatabaseSettings

    engine = create_engine(load(DatabaseSettings).database_url.get_secret_value())
    try:
        with engine.connect() as connection:
            row = connection.execute(
                text(
                    "SELECT CASE WHEN active THEN 'active' ELSE 'inactive' END, "
                    "pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::bigint "
                    "FROM pg_replication_slots WHERE slot_name = :slot"
                ),
                {"slot": slot},
            ).first()
    finally:
        engine.dispose()
    return None if row is None else (str(row[0]), int(row[1]))
