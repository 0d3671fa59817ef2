"""``outbox lake``: the ingest job, and the analysts' queries."""

from __future__ import annotations

import logging
import signal
import threading
import time
from datetime import datetime
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

import typer

from outbox.core.errors import ConfigurationError
from outbox_cli._common import fail, kafka_settings, load
from outbox_cli._output import (
    JSON_OPTION,
    WIDE,
    output_width,
    print_json,
    print_rows,
    table_text,
)

if TYPE_CHECKING:
    from outbox_lake.settings import LakeSettings

log = logging.getLogger("outbox.lake")

app = typer.Typer(
    help="The lake: ingest outbox topics into Delta tables; query them.", no_args_is_help=True
)


@app.command()
def ingest(
    available_now: bool = typer.Option(
        False, "--available-now", help="Ingest what is on Kafka now, then stop."
    ),
) -> None:
    """Run the Spark ingest job (continuous unless --available-now) until SIGTERM or Ctrl-C
    (the batch under way lands; exit 0).

    Settings: OUTBOX_LAKE_* (root, topic pattern, batch limit, trigger, Spark master) and
    OUTBOX_KAFKA_* (the cluster and its security). Spark's Kafka source and Delta's Spark
    writer: the jars of OUTBOX_LAKE_SPARK_JARS, or the coordinates of
    OUTBOX_LAKE_SPARK_PACKAGES, or (neither set) the project's pinned jars, fetched from Maven
    Central once into the stack's cache. Metrics on OUTBOX_LAKE_METRICS_PORT when set.
    """
    from outbox.core.errors import LakeStorageError, OutboxError
    from outbox_lake.ingest import Ingest
    from outbox_lake.metrics import LakeMetrics
    from outbox_lake.session import spark_session
    from outbox_lake.settings import LakeSettings
    from outbox_relay.logs import configure_json_logging

    # Every setting is checked before the jars are fetched: a typo fails in one line, at once.
    lake = load(LakeSettings)
    kafka = kafka_settings()
    settings = with_spark_jars(lake)
    configure_json_logging("INFO")
    stop = threading.Event()
    received: list[str] = []

    def request_stop(signum: int, _frame: FrameType | None) -> None:
        received.append(signal.Signals(signum).name)  # logged by the loop, not here
        stop.set()

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    metrics = LakeMetrics()
    server = _serve_metrics(settings, metrics)
    spark = spark_session(settings)
    started = time.monotonic()
    done = threading.Event()
    if available_now:  # a long catch-up says how far it has come
        threading.Thread(
            target=_report_progress, args=(metrics, started, done), daemon=True
        ).start()
    try:
        Ingest(spark, settings, kafka, metrics).run(stop, available_now=available_now)
    except LakeStorageError:
        raise  # the store's refusal, naming the variable: one line, status 2
    except OutboxError as error:
        raise fail(f"lake ingest stopped: {type(error).__name__}: {error}", error, code=1) from None
    except Exception as error:
        # Spark's own failure (a Java exception): its first line; the trace is in the log
        # above (and on stderr with --verbose).
        first = str(error).strip().splitlines()[0] if str(error).strip() else ""
        raise fail(f"lake ingest stopped: {type(error).__name__}: {first}", error, code=1) from None
    finally:
        done.set()
        if server is not None:
            server.shutdown()
        spark.stop()
    if received:
        log.info("lake ingest stopped on %s, between two batches", received[0])
    typer.secho(metrics.summary(time.monotonic() - started), err=True)


PROGRESS_SECONDS = 15.0
"""How often ``lake ingest --available-now`` says how far it has come."""


def _report_progress(metrics: Any, started: float, done: threading.Event) -> None:
    while not done.wait(PROGRESS_SECONDS):
        typer.secho(metrics.progress(time.monotonic() - started), err=True)


def _serve_metrics(settings: LakeSettings, metrics: Any) -> Any:
    if not settings.metrics_port:
        return None
    from prometheus_client import start_http_server

    server, _thread = start_http_server(
        settings.metrics_port, addr=settings.metrics_address, registry=metrics.registry
    )
    log.info("metrics on http://%s:%d/metrics", settings.metrics_address, settings.metrics_port)
    return server


def with_spark_jars(settings: LakeSettings) -> LakeSettings:
    """``settings`` with the jars the job adds to Spark: as set, or the project's own
    (resolved from its pinned Maven list, less what the pyspark wheel ships)."""
    if settings.spark_jars or settings.spark_packages:
        return settings
    from outbox_stack.artifacts import spark_extra_jars
    from outbox_stack.settings import StackSettings

    jars = spark_extra_jars(load(StackSettings).downloads_root)
    return settings.model_copy(update={"spark_jars": ",".join(str(jar) for jar in jars)})


@app.command()
def packages(
    jars: bool = typer.Option(
        False, "--jars", help="List the jar files (fetched once) instead of the coordinates."
    ),
    excludes: bool = typer.Option(
        False,
        "--excludes",
        help="Print what --packages must leave out (spark-submit --exclude-packages).",
    ),
) -> None:
    """What a Spark cluster needs to run the job: `spark-submit --packages` coordinates
    (Spark's Kafka source, Delta's Spark writer, S3A), with --excludes what to leave out of
    them (the AWS SDK's 600 MB bundle), or with --jars the local jar files."""
    from outbox_stack.artifacts import spark_extra_jars, spark_package_excludes, spark_packages
    from outbox_stack.settings import StackSettings

    if jars:
        for jar in spark_extra_jars(load(StackSettings).downloads_root):
            typer.echo(str(jar))
        return
    typer.echo(",".join(spark_package_excludes() if excludes else spark_packages()))


def existing_lake() -> LakeSettings:
    """The lake's settings, when a local root is a folder that exists (else an error that
    says where it looked and how to point elsewhere)."""
    from outbox_lake.settings import LakeSettings

    settings = load(LakeSettings)
    if settings.is_local and not Path(settings.root).is_dir():
        how = (
            "OUTBOX_LAKE_ROOT"
            if "root" in settings.model_fields_set
            else "OUTBOX_LAKE_ROOT is unset: .lake in the current folder"
        )
        raise ConfigurationError(
            f"no lake at {Path(settings.root).resolve()} ({how}): point OUTBOX_LAKE_ROOT at "
            'the lake, e.g. eval "$(outbox stack env)" for the local stack\'s'
        )
    return settings


@app.command()
def tables(as_json: bool = JSON_OPTION) -> None:
    """List the lake's tables with row counts, versions and last update; the last line says
    how fresh the lake is, and how far behind Kafka (--json: both in one object)."""
    from outbox_lake.query import freshness, list_tables

    lake = existing_lake()
    listed = list_tables(lake)
    found = freshness(lake, kafka_settings())
    now = datetime.now().astimezone()
    if as_json:
        print_json(tables_object(listed, found, now))
        return
    print_rows(TABLE_COLUMNS, table_rows(listed), right=("rows", "version"))
    typer.echo(freshness_line(found, now))


TABLE_COLUMNS = ("table", "rows", "version", "last update")


def table_rows(listed: list[Any]) -> list[tuple[object, ...]]:
    """The lake's tables (:class:`outbox_lake.query.TableInfo`) as the table's rows."""
    return [
        (
            table.name,
            f"{table.rows:,}",
            table.version,
            table.last_update.isoformat(timespec="seconds") if table.last_update else None,
        )
        for table in listed
    ]


def tables_object(listed: list[Any], found: Any, now: datetime) -> dict[str, object]:
    """``lake tables --json``: the tables, and the freshness (the line as text too)."""
    return {
        "tables": [
            {
                "name": table.name,
                "rows": table.rows,
                "version": table.version,
                "last_update": table.last_update,
            }
            for table in listed
        ],
        "freshness": {
            "last_commit": found.last_commit,
            "newest_event": found.newest_event,
            "behind": found.behind,
            "partitions_behind": found.partitions_behind,
            "unknown_reason": found.unknown_reason,
            "checked_at": now,
            "line": freshness_line(found, now),
        },
    }


def freshness_line(found: Any, now: datetime | None = None) -> str:
    """One line: how fresh ``events`` is, and what to do when the lake is behind."""
    now = now or datetime.now().astimezone()

    def ago(moment: datetime | None) -> str:
        return "never" if moment is None else f"{(now - moment).total_seconds():,.0f} s ago"

    line = (
        f"freshness: last commit {ago(found.last_commit)}, newest event {ago(found.newest_event)}"
    )
    if found.behind is None:
        return f"{line}; lag behind Kafka unknown ({found.unknown_reason})"
    if found.behind == 0:
        return f"{line}; up to date with Kafka"
    stale = found.last_commit is None or (now - found.last_commit).total_seconds() > 60
    hint = (
        " - no ingest job has committed for over a minute: is `outbox lake ingest` running? "
        "(the local stack's: `outbox stack status`)"
        if stale
        else " (the ingest job is catching up)"
    )
    return (
        f"{line}; behind Kafka by {found.behind:,} records in "
        f"{found.partitions_behind} partitions{hint}"
    )


@app.command()
def query(
    sql: str = typer.Argument(..., help="SQL over events, quarantine, aggregate_<type>."),
    output: str = typer.Option(
        "table",
        "--format",
        help="table (for people), csv (header row; empty for NULL) or json (one array of "
        "objects; decimals as exact strings, times in ISO 8601).",
    ),
) -> None:
    """Run SQL over the lake tables (DuckDB over Arrow; no Spark), print the answer."""
    import duckdb

    from outbox_lake.query import run_sql

    if output not in ("table", "csv", "json"):
        raise ConfigurationError(f"--format {output!r}: choose table, csv or json")
    try:
        columns, rows = run_sql(existing_lake(), sql)
    except duckdb.Error as error:
        raise fail(f"query error: {error}", error) from None
    typer.echo(render_answer(columns, rows, output, output_width()), nl=False)


def cell_text(value: Any) -> str:
    """A value as people read it (:func:`outbox_lake.query.display_text`), NULL said."""
    from outbox_lake.query import display_text

    return "NULL" if value is None else display_text(value)


def render_answer(
    columns: list[str], rows: list[tuple[Any, ...]], output: str, width: int = WIDE
) -> str:
    """The answer of a query as ``table`` (``width`` columns wide), ``csv`` or ``json``
    text."""
    import csv
    import io
    import json

    if output == "json":
        objects = [
            {
                name: value if value is None or isinstance(value, bool | int) else cell_text(value)
                for name, value in zip(columns, row, strict=True)
            }
            for row in rows
        ]
        return json.dumps(objects, indent=1, ensure_ascii=False) + "\n"
    if output == "csv":
        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator="\n")
        writer.writerow(columns)
        for row in rows:
            writer.writerow("" if value is None else cell_text(value) for value in row)
        return buffer.getvalue()
    cells = ([cell_text(value) for value in row] for row in rows)
    return table_text(columns, cells, caption=f"{len(rows):,} rows", width=width)


@app.command()
def maintain(
    retention_hours: int = typer.Option(
        168,
        "--retention-hours",
        min=0,
        help="Vacuum files removed longer ago than this, and files no commit names (left "
        "by a job killed mid-batch; beside a running job only those over an hour old).",
    ),
    ingest_stopped: bool = typer.Option(
        False,
        "--ingest-stopped",
        help="The lake's ingest job is stopped: required on object storage (s3://).",
    ),
) -> None:
    """Compact small files, vacuum old ones, in every table: beside a running ingest on a
    local folder; on object storage (s3://) only while the ingest job is stopped."""
    from outbox_lake.maintenance import maintain as run_maintenance

    reports = run_maintenance(
        existing_lake(), retention_hours=retention_hours, ingest_stopped=ingest_stopped
    )
    for report in reports:
        typer.echo(
            f"{report.table:<40} compacted {report.files_removed} files into "
            f"{report.files_added}; vacuumed {report.vacuumed}"
        )
