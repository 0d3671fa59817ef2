"""The demo's pipeline on the local stack, step by step; ``outbox demo`` prints around it.

Steps, in order: start the stack; migrate and create the CDC role; apply the connector;
start the lake's ingest job (continuous, a process of its own whose output goes to its log
file) and wait for its first trigger; send one warm-up event through the whole path; place
the orders (the example order service); wait until CDC has put every committed order event
on Kafka and the lake holds them all; stop the job; query the report from the lake.

Invariants: the demo counts only its own run (order events whose UUIDv7 time is at or after
the run's start, less a second of clock slack), so earlier runs on the same broker and lake
change nothing; every wait has a deadline and fails with a :class:`StackError` or
:class:`DeliveryTimeoutError` naming the log or command that shows why; the lake job is
stopped (its whole process group, Spark's JVM included) whatever happens after it started.
The job runs as ``python -m outbox_stack.demo --lake-job``: the ``--lake-job`` marker lets an
interrupted demo's job be found and stopped by the next run.
"""

from __future__ import annotations

import logging
import os
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from outbox.core.contract import topic_for
from outbox.core.errors import DeliveryTimeoutError, StackError
from outbox.settings import KafkaSettings, OutboxSettings
from outbox_lake.offsets import TOPIC_REPLACED
from outbox_lake.report import (
    OrderReport,
    count_event,
    count_events_since,
    order_report,
)
from outbox_lake.settings import LakeSettings
from outbox_stack.local import LAKE_JOB_MARKER, LocalStack
from outbox_stack.settings import StackSettings

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

    from outbox_connect import ConnectorSettings
    from outbox_examples.order_service import RunSummary

__all__ = [
    "LAKE_JOB_READY",
    "LAKE_JOB_WARM",
    "DemoPipeline",
]

log = logging.getLogger("outbox.demo")

INGEST_START_TIMEOUT_SECONDS = 180.0
LAKE_CATCH_UP_TIMEOUT_SECONDS = 180.0
RELAY_START_TIMEOUT_SECONDS = 60.0
RELAY_ROLE = "outbox_relay"  # `outbox db relay-role`'s default
DELIVERY_TIMEOUT_SECONDS = 180.0
ORDER_TYPE = "order"  # the example service's aggregate type
WARM_UP_TYPE = "demo"  # aggregate type of the warm-up event (topic outbox.event.demo)
# Logged by the demo's lake job once its first trigger has run (Spark up, source polled).
LAKE_JOB_READY = "demo lake job: first trigger done"
# Logged once each of the job's queries has finished a batch with data (the warm-up event's).
LAKE_JOB_WARM = "demo lake job: every query has landed data"
LAKE_JOB_STOPPED = "demo lake job stopped: "
"""Begins the job's last log line when an error of ours stopped it (the reason follows)."""


def _order_service() -> ModuleType:
    try:
        from outbox_examples import order_service
    except ImportError:
        raise StackError(
            "the demo needs the example service: run it from a checkout of the repository"
        ) from None
    return order_service


class DemoPipeline:
    """The demo's services and steps; each step blocks until done or raises."""

    def __init__(
        self,
        settings: OutboxSettings,
        stack_settings: StackSettings,
        kafka: KafkaSettings,
        lake_settings: LakeSettings,
    ) -> None:
        self.order_service = _order_service()
        self.settings = settings
        self.stack_settings = stack_settings
        self.stack = LocalStack(stack_settings, kafka)
        if "root" not in lake_settings.model_fields_set:  # OUTBOX_LAKE_ROOT unset
            lake_settings = lake_settings.model_copy(update={"root": str(stack_settings.lake_root)})
        self.lake_settings = lake_settings
        self.ingest = self.stack.lake_job
        self.since: float | None = None
        self._log_offset = 0
        self._engine: Engine | None = None

    @property
    def engine(self) -> Engine:
        if self._engine is None:
            from sqlalchemy import create_engine

            self._engine = create_engine(self.stack.postgres.url())
        return self._engine

    def start_stack(self) -> None:
        self.stack.up()

    def migrate(self) -> None:
        """The outbox's tables, the CDC role Debezium connects as and the relay's role."""
        import outbox_migrations

        with self.engine.begin() as connection:
            outbox_migrations.upgrade(connection, settings=self.settings)
            outbox_migrations.create_cdc_role(
                connection,
                self._connector().database_user,
                self.stack.cdc_password(),
                settings=self.settings,
            )
            outbox_migrations.create_relay_role(
                connection, RELAY_ROLE, self.stack.relay_password(), settings=self.settings
            )

    def start_relay(self) -> None:
        """The relay in auto mode, as its own least-privileged role, in a process of its own
        (its JSON log in its log file): it deletes the rows CDC delivered and publishes
        itself when CDC stops. Waits until it answers its health check."""
        import urllib.error
        import urllib.request

        relay = self.stack.relay
        relay.stop(timeout=30)  # one left by an interrupted demo
        env = {
            **os.environ,
            "OUTBOX_DATABASE_URL": self.stack.postgres.url(
                role=RELAY_ROLE, password=self.stack.relay_password()
            ),
            "OUTBOX_KAFKA_BOOTSTRAP_SERVERS": self.stack.bootstrap_servers,
            "OUTBOX_RELAY_MODE": "auto",
            "OUTBOX_RELAY_HTTP_PORT": str(self.stack_settings.relay_port),
        }
        relay.start([sys.executable, "-m", "outbox_cli.main", "relay", "run"], env=env)
        url = f"http://127.0.0.1:{self.stack_settings.relay_port}/healthz"
        deadline = time.monotonic() + RELAY_START_TIMEOUT_SECONDS
        while time.monotonic() < deadline:
            if not relay.is_running():
                raise StackError(
                    f"the relay stopped at start-up; see {relay.log_file}:\n"
                    + "\n".join(relay.tail(20))
                )
            try:
                with urllib.request.urlopen(url, timeout=2) as answer:
                    if answer.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.3)
        relay.stop(timeout=30)
        raise StackError(
            f"the relay did not answer {url} within {RELAY_START_TIMEOUT_SECONDS:.0f} s; see "
            f"{relay.log_file}"
        )

    def stop_relay(self) -> None:
        self.stack.relay.stop(timeout=30)

    def apply_connector(self) -> str:
        """Apply the Debezium connector and wait until it runs; its name."""
        from outbox_connect import ConnectClient, render_connector_config

        connector = self._connector()
        client = ConnectClient(connector.url)
        client.apply(connector.name, render_connector_config(connector, self.settings))
        client.wait_running(connector.name)
        return connector.name

    def start_lake_job(self) -> None:
        """Start the lake job (continuous) in a process of its own, its output in its log
        file, and wait until its first trigger has run: from then on an event reaches the
        lake within a trigger or two, which is what the report's latency shows."""
        self.ingest.stop(timeout=60, group=True)  # left running by an interrupted demo
        settings = self.lake_settings
        root = settings.root if not settings.is_local else str(Path(settings.root).resolve())
        # The user's other OUTBOX_LAKE_* settings come with the environment; the demo's own
        # two (its topics, an absolute root: the job runs in another folder) are set here.
        env = {
            **os.environ,
            "OUTBOX_LAKE_ROOT": root,
            "OUTBOX_LAKE_TOPIC_PATTERN": settings.topic_pattern,
            "OUTBOX_KAFKA_BOOTSTRAP_SERVERS": self.stack.bootstrap_servers,
        }
        if not settings.spark_jars and not settings.spark_packages:
            # Spark's Kafka source and Delta's writer, from the stack's own download cache.
            from outbox_stack.artifacts import spark_extra_jars

            jars = spark_extra_jars(self.stack_settings.downloads_root)
            env["OUTBOX_LAKE_SPARK_JARS"] = ",".join(map(str, jars))
        self.ingest.home.mkdir(parents=True, exist_ok=True)
        (self.ingest.home / "lake-ingest.root").write_text(f"{root}\n")  # for `stack status`
        log_file = self.ingest.log_file
        offset = log_file.stat().st_size if log_file.exists() else 0
        self._log_offset = offset  # this run's part of the log starts there
        self.ingest.start([sys.executable, "-m", "outbox_stack.demo", LAKE_JOB_MARKER], env=env)
        if not self._await_log(LAKE_JOB_READY, INGEST_START_TIMEOUT_SECONDS):
            tail = "\n".join(self.ingest.tail(20))
            self.ingest.stop(timeout=30, group=True)
            raise StackError(
                f"the lake's ingest job did not start within "
                f"{INGEST_START_TIMEOUT_SECONDS:.0f} s; see {log_file}:\n{tail}"
            )

    def _await_log(self, marker: str, timeout: float) -> bool:
        """Wait until this run's part of the job's log holds ``marker``; False after
        ``timeout`` seconds. A job that stopped raises why (and is stopped whole)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.ingest.log_file.open("rb") as log:
                log.seek(self._log_offset)
                if marker.encode() in log.read():
                    return True
            if not self.ingest.is_running():
                error = self._stopped_job_error()
                self.ingest.stop(timeout=30, group=True)  # Spark's JVM may outlive the job
                raise error
            time.sleep(0.2)
        return False

    def warm_up(self) -> None:
        """One event of type ``demo`` through the whole path, into ``events`` and its typed
        table: each query's first batch with data loads classes, compiles code and starts
        Spark's Python workers (together 20 to 30 s on two cores; the first commit of each
        is followed by seconds of Delta's first snapshot), which a long-running job has long
        done. The job logs :data:`LAKE_JOB_WARM` once both queries have finished such a
        batch; the orders' latency then shows the freshness of a running job."""
        from outbox import Event, Outbox

        event = Event(WARM_UP_TYPE, "warm-up", "LakeWarmUp", {"purpose": "start the lake job"})
        with self.engine.begin() as connection:
            Outbox(self.settings).publish(connection, event)
        event_id = str(event.event_id)
        self._await_in_lake(lambda: count_event(self.lake_settings, event_id), 1)
        if not self._await_log(LAKE_JOB_WARM, LAKE_CATCH_UP_TIMEOUT_SECONDS):
            raise DeliveryTimeoutError(
                f"the lake job's typed tables did not take the warm-up event within "
                f"{LAKE_CATCH_UP_TIMEOUT_SECONDS:.0f} s; see {self.ingest.log_file}"
            )

    def place_orders(self, orders: int, on_progress: Callable[[int], None]) -> RunSummary:
        """Run the example order service; its summary (placed, paid, rejected, duplicates)."""
        self.order_service.create_schema(self.engine)
        started = time.time()
        summary: RunSummary = self.order_service.run(
            self.engine, orders, seed=int(started), on_progress=on_progress
        )
        self.engine.dispose()
        self.since = started - 1  # a second of slack for clocks
        return summary

    def await_on_kafka(self, count: int) -> None:
        """Wait until ``count`` distinct order events of this run are on their topic (a
        record that is no event, or that no reader can take at its word, is logged and
        passed)."""
        from outbox.core.kafka_record import Undecodable, decode_event
        from outbox.kafka_reading import KafkaReader, ReaderRole
        from outbox_lake.records import event_time_of

        since = self._since()
        topic = topic_for(ORDER_TYPE)
        reader = KafkaReader(
            self.stack.kafka,
            ReaderRole(client_id="outbox-demo", when_offsets_gone="earliest"),
        )
        seen: set[uuid.UUID] = set()
        assigned = False
        deadline = time.monotonic() + DELIVERY_TIMEOUT_SECONDS
        try:
            while len(seen) < count:
                if time.monotonic() > deadline:
                    raise DeliveryTimeoutError(
                        f"CDC delivered {len(seen)} of {count} events to {topic} in "
                        f"{DELIVERY_TIMEOUT_SECONDS:.0f} s: see `outbox connect status` "
                        "and `outbox stack logs`"
                    )
                if not assigned:  # the topic appears with CDC's first record
                    partitions = reader.partitions([topic])
                    if not partitions:
                        time.sleep(0.5)
                        continue
                    reader.assign(partitions)
                    reader.seek_to_beginning(partitions)
                    assigned = True
                for record in reader.poll(0.5):
                    event = decode_event(record)
                    if isinstance(event, Undecodable):
                        log.warning("%s passed: %s", event.place, event.reason)
                    elif event_time_of(event.event_id).timestamp() >= since:
                        seen.add(event.event_id)
        finally:
            reader.close()

    def await_in_lake(self, count: int) -> None:
        """Wait until the lake holds ``count`` order events of this run."""
        since = self._since()
        self._await_in_lake(
            lambda: count_events_since(self.lake_settings, ORDER_TYPE, since), count
        )

    def stop_lake_job(self) -> None:
        self.ingest.stop(timeout=60, group=True)

    def report(self) -> OrderReport:
        return order_report(self.lake_settings, self._since(), ORDER_TYPE)

    def log_files(self) -> list[tuple[str, Path]]:
        broker = (
            [("Apache Kafka", self.stack.broker.process.log_file)]
            if self.stack.broker is not None
            else []
        )
        return [
            ("lake job (Spark)", self.ingest.log_file),
            *broker,
            ("Kafka Connect", self.stack.connect.process.log_file),
            ("PostgreSQL", self.stack.postgres.log_file),
        ]

    def _connector(self) -> ConnectorSettings:
        from outbox_connect import ConnectorSettings

        return ConnectorSettings(
            url=self.stack.connect.rest_url,
            database_port=self.stack.postgres.port,
            database_name=self.stack_settings.postgres_database,
        )

    def _since(self) -> float:
        if self.since is None:
            raise StackError("no orders placed yet: call place_orders first")
        return self.since

    def _await_in_lake(self, counted: Callable[[], int], count: int) -> None:
        deadline = time.monotonic() + LAKE_CATCH_UP_TIMEOUT_SECONDS
        found = 0
        while time.monotonic() < deadline:
            found = counted()
            if found >= count:
                return
            if not self.ingest.is_running():
                raise self._stopped_job_error()
            time.sleep(0.5)
        raise DeliveryTimeoutError(
            f"the lake holds {found} of {count} events after "
            f"{LAKE_CATCH_UP_TIMEOUT_SECONDS:.0f} s; see {self.ingest.log_file}"
        )

    def _stopped_job_error(self) -> StackError:
        """Why the lake job stopped: its data-loss refusal, said for the demo, or its log."""
        log_text = ""
        if self.ingest.log_file.exists():
            with self.ingest.log_file.open("rb") as log:
                log.seek(self._log_offset)
                log_text = log.read().decode(errors="replace")
        reason = _stop_reason(log_text)
        if reason is None or not reason.startswith("DataLossError"):
            return StackError(
                f"the lake's ingest job stopped; see {self.ingest.log_file}:\n"
                + "\n".join(self.ingest.tail(20))
            )
        refusal = f"the lake's ingest job refused to go on: {reason}"
        if TOPIC_REPLACED in reason:
            refusal = (
                f"the lake in {self.lake_settings.root} was filled from another broker than "
                "this stack's (the stack was destroyed, or its broker replaced, since): delete "
                "that folder to start the demo's lake afresh, or keep its events and run the "
                "demo once with OUTBOX_LAKE_FAIL_ON_DATA_LOSS=false. The lake job said: "
                f"{reason}"
            )
        return StackError(f"{refusal} (its log: {self.ingest.log_file})")


def _stop_reason(log_text: str) -> str | None:
    """The reason of the job's last :data:`LAKE_JOB_STOPPED` line (its logs are JSON)."""
    import json

    reason = None
    for line in log_text.splitlines():
        if LAKE_JOB_STOPPED not in line:
            continue
        try:
            message = str(json.loads(line).get("message", ""))
        except ValueError:
            continue
        reason = message.split(LAKE_JOB_STOPPED, 1)[-1]
    return reason


def run_lake_job() -> None:
    """``outbox lake ingest`` (continuous) that also says when its first trigger has run: a
    listener on the Spark session logs :data:`LAKE_JOB_READY` at the first progress; and,
    when an error of ours stops it, :data:`LAKE_JOB_STOPPED` with the reason."""
    import signal
    import threading

    from pyspark.sql.streaming.listener import StreamingQueryListener

    from outbox.core.errors import OutboxError
    from outbox_lake.ingest import Ingest
    from outbox_lake.session import spark_session
    from outbox_relay.logs import configure_json_logging

    class Markers(StreamingQueryListener):
        """Logs :data:`LAKE_JOB_READY` at the first progress of any query, and
        :data:`LAKE_JOB_WARM` once each of the job's two queries has reported a batch with
        input rows (a progress event comes once a batch is over, its commit included)."""

        def __init__(self) -> None:
            self.ready = False
            self.with_data: set[str] = set()

        def onQueryStarted(self, event: object) -> None:
            pass

        def onQueryProgress(self, event: Any) -> None:
            log = logging.getLogger("outbox.demo")
            if not self.ready:
                log.info(LAKE_JOB_READY)
                self.ready = True
            progress = getattr(event, "progress", None)
            if progress is None or progress.numInputRows <= 0 or len(self.with_data) >= 2:
                return
            self.with_data.add(str(progress.name))
            if len(self.with_data) == 2:
                log.info(LAKE_JOB_WARM)

        def onQueryIdle(self, event: object) -> None:
            self.onQueryProgress(event)

        def onQueryTerminated(self, event: object) -> None:
            pass

    settings = LakeSettings()
    if not settings.spark_jars and not settings.spark_packages:
        from outbox_stack.artifacts import spark_extra_jars

        jars = spark_extra_jars(StackSettings().downloads_root)
        settings = settings.model_copy(update={"spark_jars": ",".join(map(str, jars))})
    configure_json_logging("INFO")
    kafka = KafkaSettings()
    if kafka.bootstrap_servers is None:
        raise StackError("the demo's lake job needs OUTBOX_KAFKA_BOOTSTRAP_SERVERS")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda _signum, _frame: stop.set())
    signal.signal(signal.SIGINT, lambda _signum, _frame: stop.set())
    spark = spark_session(settings)
    spark.streams.addListener(Markers())
    try:
        Ingest(spark, settings, kafka).run(stop)
    except OutboxError as error:
        logging.getLogger("outbox.demo").error(
            "%s%s: %s", LAKE_JOB_STOPPED, type(error).__name__, error
        )
        raise
    finally:
        spark.stop()  # the JVM ends its context now, and exits once this process has


if __name__ == "__main__" and sys.argv[1:] == [LAKE_JOB_MARKER]:
    run_lake_job()
