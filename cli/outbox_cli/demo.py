"""``outbox demo``: the main job, the whole pipeline on the embedded default.

The steps are :class:`outbox_stack.demo.DemoPipeline`'s and the report's queries are
:mod:`outbox_lake.report`'s; this module only shows them: a spinner per step, a progress bar while
the order service writes, the report from the lake (orders per status, events per type, the
commit-to-queryable latency, which is freshness because the lake job ran while the orders
were written), the log files (Spark's, Connect's, PostgreSQL's) and the next commands to try.
No service writes to the console.
"""

from __future__ import annotations

import shlex
import shutil
import sys
from pathlib import Path

import typer

from outbox_cli._common import configure_logging, load

EXAMPLE_QUERY = "SELECT event_type, count(*) FROM events GROUP BY 1"


def invoked_as() -> str:
    """How to call this command again: ``outbox`` when that is what the PATH finds, else the
    path it was run by (``.venv/bin/outbox`` after ``make demo``)."""
    program = Path(sys.argv[0])
    if program.name != "outbox":  # python -m outbox_cli.main: the PATH's, if any
        return "outbox"
    found = shutil.which("outbox")
    if found is not None and Path(found).resolve() == program.resolve():
        return "outbox"
    try:
        shown = program.resolve().relative_to(Path.cwd())
    except ValueError:
        shown = program.resolve()
    return shlex.quote(str(shown))


def run_demo(
    orders: int = typer.Option(40, "--orders", min=1, max=100_000, help="Orders to place."),
    verbose: bool = typer.Option(
        False, "--verbose", "-v", help="Log each step; a traceback on error."
    ),
) -> None:
    """Run the whole pipeline on the local stack and print a report from the lake."""
    configure_logging(verbose)
    from rich.console import Console
    from rich.progress import Progress
    from rich.table import Table

    from outbox.core.contract import topic_for
    from outbox.settings import KafkaSettings, OutboxSettings
    from outbox_lake.settings import LakeSettings
    from outbox_stack.demo import ORDER_TYPE, DemoPipeline
    from outbox_stack.settings import StackSettings, remember_stack

    console = Console()
    demo = DemoPipeline(
        load(OutboxSettings), load(StackSettings), load(KafkaSettings), load(LakeSettings)
    )
    stack = demo.stack
    with console.status("starting PostgreSQL, the broker and Kafka Connect"):
        demo.start_stack()
    remember_stack(demo.stack_settings)  # `outbox stack ...` finds it from any folder
    console.print(
        f"[green]stack[/] postgres {stack.postgres.display_url()}, "
        f"kafka {stack.bootstrap_servers}, connect {stack.connect.rest_url}"
    )
    demo.migrate()
    console.print(f"[green]migrated[/] outbox schema {demo.settings.schema_name!r}, CDC role")
    with console.status("applying the Debezium connector"):
        connector = demo.apply_connector()
    console.print(f"[green]connector[/] {connector} running")
    with console.status("starting the relay (auto mode)"):
        demo.start_relay()
    console.print(
        "[green]relay[/] auto mode: deletes the rows CDC delivered, publishes if CDC stops"
    )
    lake_root = demo.lake_settings.root
    with console.status("starting the lake's ingest job (Spark)"):
        demo.start_lake_job()
    try:
        with console.status("warming up the lake job (its first batch starts Spark's workers)"):
            demo.warm_up()
        console.print(f"[green]lake job[/] running, ingesting into {lake_root}")
        with Progress(console=console, transient=True) as progress:
            task = progress.add_task("placing orders", total=orders)
            summary = demo.place_orders(orders, lambda done: progress.advance(task, done))
        console.print(
            f"[green]order service[/] placed {summary.placed}, paid {summary.paid}, "
            f"rejected {summary.rejected} (rolled back: no event), "
            f"retried payments ignored {summary.duplicate_payments} (dedup key)"
        )
        events = summary.placed + summary.paid
        topic = topic_for(ORDER_TYPE)
        with console.status(f"waiting for CDC to deliver {events} events"):
            demo.await_on_kafka(events)
        console.print(f"[green]kafka[/] all {events} events on {topic}")
        with console.status(f"waiting for the lake to hold {events} events"):
            demo.await_in_lake(events)
        console.print(f"[green]lake[/] all {events} events in {lake_root}")
    except BaseException:  # a failure or Ctrl-C: nothing is left running behind the user
        with console.status("stopping the lake's ingest job and the relay"):
            demo.stop_lake_job()
            demo.stop_relay()
        raise
    report = demo.report()

    for title, columns, rows in (
        ("lake: orders per status", ("status", "orders"), report.by_status),
        ("lake: events per type", ("event type", "events"), report.by_type),
    ):
        table = Table(title=title)
        for column in columns:
            table.add_column(column)
        for row in rows:
            table.add_row(*(str(value) for value in row))
        console.print(table)
    if report.latency_p50 is not None and report.latency_p95 is not None:
        console.print(
            f"commit-to-queryable latency (event id time to lake ingest time): "
            f"p50 {report.latency_p50:.1f} s, p95 {report.latency_p95:.1f} s "
            "(the lake job ran while the orders were written)"
        )
    console.print("Logs:")
    for name, path in demo.log_files():
        console.print(f"  {name:<17} {path}", highlight=False, soft_wrap=True)
    lake_env = f"OUTBOX_LAKE_ROOT={shlex.quote(lake_root)}"
    outbox = invoked_as()
    on_path = (
        []
        if outbox == "outbox"
        else [
            f"(`outbox` is not on your PATH: call {outbox} as below, or "
            f"`source {shlex.quote(str(Path(outbox).parent / 'activate'))}` first)"
        ]
    )
    next_steps = [
        "The stack keeps running, the relay (auto mode) and the lake's ingest job (every "
        f"outbox topic, into {lake_root}) with it: `{outbox} stack status` shows them, "
        f"`{outbox} stack down` stops them all. Next, try:",
        *on_path,
        f"  {lake_env} {outbox} lake query {shlex.quote(EXAMPLE_QUERY)}",
        f"  {lake_env} {outbox} lake tables",
        f"  {outbox} stack status",
        f"  {outbox} stack down      # stops the stack and the lake job; data is kept",
    ]
    console.print("\n".join(next_steps), highlight=False, soft_wrap=True)
