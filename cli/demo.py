"""``outbox demo``: the main job, end to end on the local stack.

For now: start the private Postgres, apply the outbox migrations, run the example order
service, and show what it left in the outbox. Later stages (CDC, relay, lake) join here.
"""

from __future__ import annotations

import typer

from cli._common import configure_logging, friendly_errors, load


def run_demo(
    orders: int = typer.Option(40, "--orders", min=1, max=100_000, help="Orders to place."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Log each step."),
) -> None:
    """Run the whole pipeline on the local stack and print what it produced."""
    configure_logging(verbose)
    from rich.console import Console
    from rich.progress import Progress
    from rich.table import Table
    from sqlalchemy import create_engine, text

    import migrations
    from outbox.settings import OutboxSettings
    from stack import PostgresCluster, StackSettings

    try:
        from examples import order_service
    except ImportError:
        typer.secho(
            "the demo needs the example service: run it from a checkout of the repository",
            err=True,
        )
        raise typer.Exit(2) from None

    console = Console()
    settings = load(OutboxSettings)
    cluster = PostgresCluster(load(StackSettings))
    with friendly_errors():
        with console.status("starting the private Postgres"):
            cluster.up()
        console.print(f"[green]postgres[/] {cluster.display_url()}")
        engine = create_engine(cluster.url())
        with engine.begin() as connection:
            migrations.upgrade(connection, settings=settings)
        console.print(f"[green]migrated[/] outbox schema {settings.schema_name!r}")
        order_service.create_schema(engine)
        with Progress(console=console, transient=True) as progress:
            task = progress.add_task("placing orders", total=orders)
            summary = order_service.run(
                engine, orders, on_progress=lambda done: progress.advance(task, done)
            )
        console.print(
            f"[green]order service[/] placed {summary.placed}, paid {summary.paid}, "
            f"rejected {summary.rejected} (rolled back: no event), "
            f"retried payments ignored {summary.duplicate_payments} (dedup key)"
        )
        outbox_table = settings.tables.qualified_outbox
        with engine.connect() as connection:
            by_type = connection.execute(
                text(
                    f"SELECT aggregatetype, type, count(*) FROM {outbox_table} "  # noqa: S608
                    "GROUP BY 1, 2 ORDER BY 1, 2"
                )
            ).all()
            latest = connection.execute(
                text(
                    f"SELECT position, aggregatetype, aggregateid, type, payload::text "  # noqa: S608
                    f"FROM {outbox_table} ORDER BY position DESC LIMIT 8"
                )
            ).all()
        engine.dispose()

    table = Table(title="outbox: events by type")
    for column in ("aggregate type", "event type", "events"):
        table.add_column(column)
    for aggregate_type, event_type, count in by_type:
        table.add_row(aggregate_type, event_type, str(count))
    console.print(table)
    recent = Table(title="outbox: latest events")
    recent.add_column("position", justify="right", no_wrap=True, min_width=8)
    recent.add_column("aggregate", no_wrap=True, min_width=9)
    recent.add_column("type", no_wrap=True, min_width=11)
    recent.add_column("payload", no_wrap=True)
    room = max(20, console.width - 44)
    for position, aggregate_type, aggregate_id, event_type, payload in reversed(latest):
        shown = payload if len(payload) <= room else payload[: room - 1] + "…"
        recent.add_row(str(position), f"{aggregate_type}/{aggregate_id}", event_type, shown)
    console.print(recent)
    console.print("The private Postgres keeps running: `outbox stack down` stops it.")
