"""``outbox demo``: the main job, the whole pipeline on the embedded default.

Starts the native stack (PostgreSQL, the broker, Kafka Connect with Debezium), migrates,
creates the CDC role and applies the connector, starts the lake's Spark ingest job (``outbox
lake ingest``, continuous, in a process of its own whose output goes to a log file), runs the
example order service (progress bar) while the job ingests, waits until CDC has put every
committed event on Kafka and the lake holds them all, stops the job, and prints a report
queried from the lake: orders per status, events per type, and the commit-to-queryable
latency it saw, which is freshness because the job ran while the orders were written. The
console shows progress, the report, the log files (Spark's, Connect's, PostgreSQL's) and the
next commands to try; no service writes to it.
"""

from __future__ import annotations

import logging
import os
import shlex
import sys
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from cli._common import configure_logging, friendly_errors, load
from stack.errors import StackError

if TYPE_CHECKING:
    from lake.settings import LakeSettings
    from outbox.settings import OutboxSettings
    from stack.process import ServiceProcess

INGEST_START_TIMEOUT_SECONDS = 180.0
LAKE_CATCH_UP_TIMEOUT_SECONDS = 180.0
EXAMPLE_QUERY = "SELECT event_type, count(*) FROM events GROUP BY 1"
# The report's rows: this run's orders' events (the warm-up event is of another type).
THIS_RUN = "aggregate_type = 'order' AND event_time >= to_timestamp(?)"
WARM_UP_TYPE = "demo"  # aggregate type of the warm-up event (topic outbox.event.demo)
# Printed by the demo's lake job once its first trigger has run (Spark up, source polled).
LAKE_JOB_READY = "demo lake job: first trigger done"


def run_demo(
    orders: int = typer.Option(40, "--orders", min=1, max=100_000, help="Orders to place."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Log each step."),
) -> None:
    """Run the whole pipeline on the local stack and print a report from the lake."""
    configure_logging(verbose)
    from rich.console import Console
    from rich.progress import Progress
    from rich.table import Table
    from sqlalchemy import create_engine, text

    import migrations
    from connect import ConnectClient, ConnectorSettings, render_connector_config
    from lake.query import run_sql
    from lake.settings import LakeSettings
    from outbox.core.contract import topic_for
    from outbox.settings import KafkaSettings, OutboxSettings
    from stack.local import LocalStack
    from stack.process import ServiceProcess
    from stack.settings import StackSettings

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
    stack_settings = load(StackSettings)
    stack = LocalStack(stack_settings, load(KafkaSettings))
    lake_settings = load(LakeSettings)
    if lake_settings.topic_pattern == LakeSettings.model_fields["topic_pattern"].default:
        # The demo's own topic only: the local broker may hold other experiments' topics.
        lake_settings = lake_settings.model_copy(
            update={"topic_pattern": rf"^outbox\.event\.(order|{WARM_UP_TYPE})$"}
        )
    with friendly_errors():
        with console.status("starting PostgreSQL, the broker and Kafka Connect"):
            stack.up()
        console.print(
            f"[green]stack[/] postgres {stack.postgres.display_url()}, "
            f"kafka {stack.bootstrap_servers}, connect {stack.connect.rest_url}"
        )
        engine = create_engine(stack.postgres.url())
        connector = ConnectorSettings(
            url=stack.connect.rest_url,
            database_port=stack.postgres.port,
            database_name=stack_settings.postgres_database,
        )
        with engine.begin() as connection:
            migrations.upgrade(connection, settings=settings)
            migrations.create_cdc_role(
                connection, connector.database_user, stack.cdc_password(), settings=settings
            )
        console.print(f"[green]migrated[/] outbox schema {settings.schema_name!r}, CDC role")
        client = ConnectClient(connector.url)
        with console.status("applying the Debezium connector"):
            client.apply(connector.name, render_connector_config(connector, settings))
            client.wait_running(connector.name)
        console.print(f"[green]connector[/] {connector.name} running")

        ingest = ServiceProcess("lake-ingest", stack_settings.root / "demo", marker="--lake-job")
        ingest.stop(timeout=60, group=True)  # left running by an interrupted demo
        with console.status("starting the lake's ingest job (Spark)"):
            _start_ingest(ingest, lake_settings, stack.bootstrap_servers)
        try:
            with console.status("warming up the lake job (its first batch starts Spark's workers)"):
                _warm_up(engine, settings, lake_settings, ingest)
            console.print(f"[green]lake job[/] running, ingesting into {lake_settings.root}")
            order_service.create_schema(engine)
            started = time.time()
            with Progress(console=console, transient=True) as progress:
                task = progress.add_task("placing orders", total=orders)
                summary = order_service.run(
                    engine,
                    orders,
                    seed=int(started),
                    on_progress=lambda done: progress.advance(task, done),
                )
            console.print(
                f"[green]order service[/] placed {summary.placed}, paid {summary.paid}, "
                f"rejected {summary.rejected} (rolled back: no event), "
                f"retried payments ignored {summary.duplicate_payments} (dedup key)"
            )
            table = settings.tables.qualified_outbox
            with engine.connect() as connection:
                written = {
                    row[0]
                    for row in connection.execute(
                        text(
                            f"SELECT id FROM {table} WHERE aggregatetype = 'order' "  # noqa: S608
                            "AND created_at >= to_timestamp(:t)"
                        ),
                        {"t": started},
                    )
                }
            engine.dispose()
            # This run's events, by their UUIDv7 creation time (a second of slack for clocks).
            started -= 1
            with console.status(f"waiting for CDC to deliver {len(written)} events"):
                _await_on_kafka(stack.bootstrap_servers, topic_for("order"), written)
            console.print(f"[green]kafka[/] all {len(written)} events on {topic_for('order')}")
            with console.status(f"waiting for the lake to hold {len(written)} events"):
                _await_in_lake(
                    lake_settings,
                    ingest,
                    f"SELECT count(*) FROM events WHERE {THIS_RUN}",  # noqa: S608
                    [started],
                    len(written),
                )
            console.print(f"[green]lake[/] all {len(written)} events in {lake_settings.root}")
        finally:
            with console.status("stopping the lake's ingest job"):
                ingest.stop(timeout=60, group=True)
        _, by_type = run_sql(
            lake_settings,
            f"SELECT event_type, count(*) FROM events WHERE {THIS_RUN} "  # noqa: S608
            "GROUP BY 1 ORDER BY 1",
            [started],
        )
        _, by_status = run_sql(
            lake_settings,
            "SELECT status, count(*) FROM (SELECT aggregate_id, "  # noqa: S608
            "CASE WHEN bool_or(event_type = 'OrderPaid') THEN 'paid' ELSE 'placed' END AS status "
            f"FROM events WHERE {THIS_RUN} GROUP BY 1) GROUP BY 1 ORDER BY 1",
            [started],
        )
        _, latency = run_sql(
            lake_settings,
            "SELECT quantile_cont(s, 0.5), quantile_cont(s, 0.95) FROM (SELECT "  # noqa: S608
            "epoch(ingest_time) - epoch(event_time) AS s FROM events "
            f"WHERE {THIS_RUN})",
            [started],
        )

    for title, columns, rows in (
        ("lake: orders per status", ("status", "orders"), by_status),
        ("lake: events per type", ("event type", "events"), by_type),
    ):
        report = Table(title=title)
        for column in columns:
            report.add_column(column)
        for row in rows:
            report.add_row(*(str(value) for value in row))
        console.print(report)
    p50, p95 = latency[0] if latency else (None, None)
    if p50 is not None:
        console.print(
            f"commit-to-queryable latency (event id time to lake ingest time): "
            f"p50 {p50:.1f} s, p95 {p95:.1f} s (the lake job ran while the orders were written)"
        )
    console.print("Logs:")
    for name, path in (
        ("lake job (Spark)", ingest.log_file),
        ("Kafka Connect", stack.connect.process.log_file),
        ("PostgreSQL", stack.postgres.log_file),
    ):
        console.print(f"  {name:<17} {path}", highlight=False, soft_wrap=True)
    lake_env = f"OUTBOX_LAKE_ROOT={shlex.quote(lake_settings.root)}"
    next_steps = [
        "The stack keeps running. Next, try:",
        f"  {lake_env} outbox lake query {shlex.quote(EXAMPLE_QUERY)}",
        f"  {lake_env} outbox lake tables",
        "  outbox stack status",
        "  outbox stack down      # stops the stack (its broker keeps topics in memory only)",
    ]
    console.print("\n".join(next_steps), highlight=False, soft_wrap=True)


def _start_ingest(ingest: ServiceProcess, settings: LakeSettings, bootstrap: str) -> None:
    """Start the lake job (:func:`_lake_job`, continuous) in a process of its own, its output
    in its log file, and wait until its first trigger has run: from then on an event reaches
    the lake within a trigger or two, which is what the demo's latency shows."""
    root = settings.root if not settings.is_local else str(Path(settings.root).resolve())
    # The user's other OUTBOX_LAKE_* settings come with the environment; the demo's own two
    # (its topics, an absolute root: the job runs in another folder) are set here.
    env = {
        **os.environ,
        "OUTBOX_LAKE_ROOT": root,
        "OUTBOX_LAKE_TOPIC_PATTERN": settings.topic_pattern,
        "OUTBOX_KAFKA_BOOTSTRAP_SERVERS": bootstrap,
    }
    ingest.home.mkdir(parents=True, exist_ok=True)
    offset = ingest.log_file.stat().st_size if ingest.log_file.exists() else 0
    ingest.start([sys.executable, "-m", "cli.demo", "--lake-job"], env=env)
    deadline = time.monotonic() + INGEST_START_TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        with ingest.log_file.open("rb") as log:
            log.seek(offset)
            if LAKE_JOB_READY.encode() in log.read():
                return
        if not ingest.is_running():
            break
        time.sleep(0.2)
    tail = "\n".join(ingest.tail(20))
    ingest.stop(timeout=30, group=True)
    raise StackError(
        f"the lake's ingest job did not start within {INGEST_START_TIMEOUT_SECONDS:.0f} s; "
        f"see {ingest.log_file}:\n{tail}"
    )


def _warm_up(
    engine: Any, settings: OutboxSettings, lake_settings: LakeSettings, ingest: ServiceProcess
) -> None:
    """One event of type ``demo`` through the whole path, into the lake: the lake job's first
    batch with data starts Spark's Python workers (seconds), which a long-running job has
    long done; the orders' latency then shows the freshness of a running job."""
    from outbox import Event, Outbox

    event = Event(WARM_UP_TYPE, "warm-up", "LakeWarmUp", {"purpose": "start the lake job"})
    with engine.begin() as connection:
        Outbox(settings).publish(connection, event)
    _await_in_lake(
        lake_settings,
        ingest,
        "SELECT count(*) FROM events WHERE event_id = ?",
        [str(event.event_id)],
        1,
    )


def _await_in_lake(
    settings: LakeSettings, ingest: ServiceProcess, sql: str, params: list[Any], count: int
) -> None:
    """Wait until ``sql`` (a count over the lake's tables) reaches ``count``."""
    import duckdb

    from lake.query import run_sql

    deadline = time.monotonic() + LAKE_CATCH_UP_TIMEOUT_SECONDS
    found = 0
    while time.monotonic() < deadline:
        try:
            _, rows = run_sql(settings, sql, params)
            found = int(rows[0][0])
        except duckdb.CatalogException:
            found = 0  # no events table yet
        if found >= count:
            return
        if not ingest.is_running():
            raise StackError(
                f"the lake's ingest job stopped; see {ingest.log_file}:\n"
                + "\n".join(ingest.tail(20))
            )
        time.sleep(0.5)
    raise StackError(
        f"the lake holds {found} of {count} events after "
        f"{LAKE_CATCH_UP_TIMEOUT_SECONDS:.0f} s; see {ingest.log_file}"
    )


def _await_on_kafka(
    bootstrap: str, topic: str, wanted: set[uuid.UUID], timeout: float = 180
) -> None:
    from kafka import KafkaConsumer

    from outbox.core.contract import event_id_of

    consumer = KafkaConsumer(
        topic,
        bootstrap_servers=bootstrap.split(","),
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        consumer_timeout_ms=500,
    )
    seen: set[uuid.UUID] = set()
    deadline = time.monotonic() + timeout
    try:
        while not wanted <= seen:
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"CDC delivered {len(wanted & seen)} of {len(wanted)} events in {timeout} s: "
                    "see `outbox connect status` and `outbox stack logs`"
                )
            for record in consumer:
                seen.add(event_id_of(record.headers))
    finally:
        consumer.close()


def _lake_job() -> None:
    """`outbox lake ingest` (continuous) that also says when its first trigger has run: a
    listener on the Spark session logs :data:`LAKE_JOB_READY` at the first progress."""
    from pyspark.sql.streaming.listener import StreamingQueryListener

    from lake.job import run_ingest, spark_session
    from lake.settings import LakeSettings
    from outbox.settings import KafkaSettings
    from relay.logs import configure_json_logging

    class FirstTrigger(StreamingQueryListener):
        told = False

        def onQueryStarted(self, event: object) -> None:
            pass

        def onQueryProgress(self, event: object) -> None:
            if not self.told:
                logging.getLogger("outbox.demo").info(LAKE_JOB_READY)
                self.told = True

        def onQueryIdle(self, event: object) -> None:
            self.onQueryProgress(event)

        def onQueryTerminated(self, event: object) -> None:
            pass

    settings = LakeSettings()
    configure_json_logging("INFO")
    spark = spark_session(settings)
    spark.streams.addListener(FirstTrigger())
    bootstrap = KafkaSettings().bootstrap_servers
    if bootstrap is None:
        raise SystemExit("OUTBOX_KAFKA_BOOTSTRAP_SERVERS is not set")
    run_ingest(settings, bootstrap, available_now=False, spark=spark)


if __name__ == "__main__" and sys.argv[1:] == ["--lake-job"]:
    _lake_job()
