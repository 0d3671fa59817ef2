"""``outbox reconcile`` and ``outbox trace``: prove delivery after the fact, follow one event.

Exit codes: 0 nothing found; 1 at least one finding (reconcile) or the event was found
nowhere (trace); 2 a configuration error or a source that cannot be read.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import typer

from outbox_cli._common import fail, load

__all__ = ["register"]


def register(app: typer.Typer) -> None:
    app.command("reconcile")(reconcile)
    app.command("trace")(trace)


@contextmanager
def _readable_failures() -> Iterator[None]:
    """A source that cannot be read ends the run with one line naming it, and status 2."""
    import psycopg
    from deltalake.exceptions import DeltaError

    from outbox.core.errors import BrokerError, ShortReadError

    try:
        yield
    except psycopg.Error as error:
        raise fail(f"outbox database: {error} (check OUTBOX_DATABASE_URL)", error) from None
    except ShortReadError as error:
        raise fail(f"Kafka read short, no report: {error}", error) from None
    except BrokerError as error:
        raise fail(f"{error} (check OUTBOX_KAFKA_BOOTSTRAP_SERVERS)", error) from None
    except (DeltaError, OSError) as error:
        raise fail(f"lake: {error} (check OUTBOX_LAKE_ROOT)", error) from None


def _moment(value: str | None, option: str) -> Any:
    from outbox_reconcile.records import parse_moment

    if value is None:
        return None
    try:
        return parse_moment(value)
    except ValueError as error:
        typer.secho(f"{option}: {error}", err=True, fg="red")
        raise typer.Exit(2) from None


def _sources() -> Any:
    from outbox.settings import DatabaseSettings, OutboxSettings
    from outbox_cli._common import kafka_settings
    from outbox_lake.settings import LakeSettings
    from outbox_reconcile.run import Sources

    return Sources(
        database_url=load(DatabaseSettings).database_url.get_secret_value(),
        tables=load(OutboxSettings).tables,
        kafka=kafka_settings(),
        lake=load(LakeSettings),
    )


@contextmanager
def _progress(enabled: bool) -> Iterator[Callable[[str], Callable[[int], None]]]:
    """A rich progress display on stderr: one line per phase, items counted as they come."""
    from rich.console import Console
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    progress = Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        TextColumn("{task.completed:,.0f}"),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        disable=not enabled,
        transient=False,
    )
    current: list[Any] = []

    def phase(name: str) -> Callable[[int], None]:
        if current:
            progress.update(current[-1], total=1, completed=progress.tasks[-1].completed)
        task = progress.add_task(name, total=None)
        current.append(task)
        return lambda count: progress.advance(task, count)

    with progress:
        yield phase


def reconcile(
    since: str | None = typer.Option(
        None, "--since", help="Events from this time on (ISO 8601, or 90m, 24h, 7d ago)."
    ),
    until: str | None = typer.Option(None, "--until", help="Events before this time."),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress display."),
    metrics_file: str | None = typer.Option(
        None, "--metrics-file", help="Also write Prometheus metrics here (textfile collector)."
    ),
) -> None:
    """Compare the outbox, Kafka and the lake; exit 1 on any finding.

    Read-only. Reports per aggregate type: outbox rows stuck, dead letters, events on Kafka
    missing from the lake, duplicates in the lake, lake rows never on Kafka, per-aggregate
    position order violations on Kafka and in the lake, typed rows missing, quarantine by
    reason. The window is on the time in each event's UUIDv7 id. See
    docs/verifying-delivery.md.
    """
    from outbox_reconcile.records import Window
    from outbox_reconcile.run import run_reconcile
    from outbox_reconcile.settings import ReconcileSettings

    settings = load(ReconcileSettings)
    try:
        window = Window(_moment(since, "--since"), _moment(until, "--until"))
    except ValueError as error:
        typer.secho(str(error), err=True, fg="red")
        raise typer.Exit(2) from None
    with _readable_failures():
        sources = _sources()
        with _progress(not quiet) as phases:
            report = run_reconcile(sources, settings, window, phases)
    if metrics_file:
        from outbox_reconcile.metrics import ReconcileMetrics

        metrics = ReconcileMetrics()
        metrics.record(report)
        metrics.write(metrics_file)
    if as_json:
        typer.echo(json.dumps(report.to_dict(), indent=2, default=str))
    else:
        _print_report(report)
    raise typer.Exit(report.exit_code)


def _print_report(report: Any) -> None:
    from outbox_reconcile.findings import FINDING_KINDS

    typer.echo(f"reconcile: {report.window}")
    figures = report.figures
    typer.echo(
        f"  outbox rows {figures['outbox_rows']:,} (in flight {figures['outbox_rows_in_flight']:,}"
        f"), dead letters {figures['dead_letters']:,}; Kafka: {figures['kafka_events']:,} "
        f"events in {figures['kafka_records']:,} records ({figures['kafka_partitions']} "
        f"partitions); lake: {figures['lake_events']:,} events, "
        f"{figures['lake_pending_ingest']:,} not ingested yet"
    )
    behind = figures["lake_pending_ingest"]
    if behind:
        typer.secho(
            f"  the lake is {behind:,} events behind Kafka (on Kafka, not ingested yet): they "
            "are not judged; if that does not shrink, is `outbox lake ingest` running? "
            "(`outbox lake tables` shows the lake's freshness)",
            fg="yellow",
        )
    if not report.findings:
        typer.secho(
            "no findings"
            + (f" among what the lake has taken in ({behind:,} not yet)" if behind else ""),
            fg="green",
        )
        return
    for aggregate_type, kinds in sorted(report.by_aggregate_type().items()):
        typer.secho(f"aggregate type {aggregate_type!r}:", bold=True)
        for kind, count in sorted(kinds.items()):
            typer.secho(f"  {kind}: {count:,}  ({FINDING_KINDS[kind]})", fg="red")
    for finding in report.findings:
        for example in finding.examples:
            detail = ", ".join(f"{key}={value}" for key, value in example.items())
            typer.echo(f"  {finding.kind} [{finding.aggregate_type}] {detail}")
    typer.secho(f"{report.finding_count:,} finding(s)", fg="red", bold=True)


def trace(
    event_id: str = typer.Argument(..., help="The event id (a UUID)."),
    as_json: bool = typer.Option(False, "--json", help="Print the lineage as JSON."),
    scan_kafka: bool = typer.Option(
        False,
        "--scan-kafka",
        help="Search every outbox topic for copies when the event's partition is unknown.",
    ),
) -> None:
    """Where an event is: outbox row, dead letter, Kafka copies, lake tables, Delta version,
    ingest time and commit-to-queryable latency. Exit 1 when it is found nowhere."""
    import uuid

    from outbox_reconcile.trace import trace_event

    try:
        wanted = uuid.UUID(event_id)
    except ValueError:
        typer.secho(
            f"error: EVENT_ID {event_id!r} is not a UUID: give an event id as `outbox lake "
            "query` or a Kafka record's 'id' header shows it",
            err=True,
            fg="red",
        )
        raise typer.Exit(2) from None
    with _readable_failures():
        lineage = trace_event(_sources(), str(wanted), scan_kafka=scan_kafka)
    if as_json:
        typer.echo(json.dumps(lineage.to_dict(), indent=2, default=str))
    else:
        for line in lineage.lines():
            typer.echo(line)
    raise typer.Exit(0 if lineage.found else 1)
