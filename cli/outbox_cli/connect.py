"""``outbox connect``: the Debezium connector of the CDC path, through Connect's REST API."""

from __future__ import annotations

import typer

from outbox_cli._common import kafka_settings, load
from outbox_cli._output import JSON_OPTION, print_json
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
def status(as_json: bool = JSON_OPTION) -> None:
    """Connector and task states; transactions left open on Connect's offsets topic; the
    replication slot's state, retained WAL (lag) in bytes, and PostgreSQL's
    max_slot_wal_keep_size with a recommendation (--json: all of it in one object).

    The slot report needs OUTBOX_DATABASE_URL. Exit 1 unless everything runs and no hanging
    transaction holds Connect's offsets topic.
    """
    import os

    from outbox.settings import DatabaseSettings
    from outbox_connect import ConnectorSettings
    from outbox_connect.status import read_connect_status

    settings = load(ConnectorSettings)
    database_url = (
        load(DatabaseSettings).database_url.get_secret_value()
        if os.environ.get("OUTBOX_DATABASE_URL")
        else None
    )
    report = read_connect_status(settings, kafka_settings(), database_url)
    if as_json:
        print_json(report.to_dict())
    else:
        for line in report.lines():
            typer.echo(line)
    if not report.ok:
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
