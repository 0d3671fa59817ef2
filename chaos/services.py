"""The pipeline a chaos run drives, on a native stack of its own, and how it is restarted.

- The local stack (``stack.local.LocalStack``: PostgreSQL, the broker (Apache Kafka),
  Kafka Connect) in ``OUTBOX_CHAOS_STACK_DIR`` on free loopback ports, deleted and made
  again at every run, so nothing of an earlier run (a connector, a topic) takes part;
- the outbox migrated, a CDC role and a relay role, the connector applied (heartbeat every
  second);
- two ``outbox relay run`` processes in auto mode as the relay role, one leading and one on
  standby, each reaching PostgreSQL through a TCP proxy of its own (the network to cut);
- the lake job, ``outbox lake ingest`` (continuous), a process group of its own.

The ``restart_*`` and ``ensure_*`` methods are what an operator (or a supervisor) does after
a fault; every wait has a deadline. One lock per service (:attr:`ChaosServices.locks`): a
fault holds it from injection to recovery, and the watchdog (:mod:`chaos.watchdog`) leaves a
service alone while its lock is held; :meth:`ChaosServices.components` is what it watches.
"""

from __future__ import annotations

import contextlib
import functools
import os
import secrets
import shutil
import signal
import socket
import sys
import threading
import time
import urllib.parse
from pathlib import Path

import psutil
import psycopg
import sqlalchemy as sa

import outbox_migrations
from chaos.plans import ACCOUNT, ORDER, schema_statements
from chaos.settings import ROOT, ChaosSettings
from chaos.watchdog import Component, exit_status
from outbox import OutboxSettings
from outbox.core.errors import OutboxError
from outbox.settings import KafkaSettings
from outbox_connect import ConnectClient, ConnectError, ConnectorSettings, render_connector_config
from outbox_connect.open_transactions import IDLE_SECONDS, open_transactions, unblock
from outbox_lake.settings import LakeSettings
from outbox_stack.errors import StackError
from outbox_stack.local import LocalStack
from outbox_stack.process import ServiceProcess
from tests.fix_postgres import free_port
from tests.fix_proxy import TcpProxy
from tests.fix_relay import RelayProcess, wait_until
from tests.fix_stack import stack_settings

__all__ = ["OUTBOX_COMMAND", "RESOURCES", "ChaosServices", "service_stopped"]

CDC_ROLE = "chaos_cdc"
RELAY_ROLE = "chaos_relay"
CONNECTOR = "chaos"
TOPIC_PREFIX = "chaos"
TOPIC_PATTERN = rf"^outbox\.event\.({ORDER}|{ACCOUNT})$"
RESOURCES = ("postgres", "broker", "connect", "relay", "lake")
OUTBOX_COMMAND = (sys.executable, "-m", "outbox_cli.main")
"""The ``outbox`` command, as this checkout runs it."""
LAKE_START_TIMEOUT_SECONDS = 240.0
CONNECTOR_TIMEOUT_SECONDS = 240.0
UNBLOCK_AFTER_SECONDS = 60.0
"""How long CDC may stay silent before the offsets topic is checked (and every minute on)."""


class ChaosServices:
    def __init__(self, settings: ChaosSettings) -> None:
        self.settings = settings
        self.stack_settings = stack_settings(settings.stack_dir, free_port())
        # The chaos stack's own broker, whatever OUTBOX_KAFKA_BOOTSTRAP_SERVERS says.
        self.stack = LocalStack(self.stack_settings, KafkaSettings(bootstrap_servers=None))
        self.run_dir = settings.run_dir
        self.locks = {name: threading.Lock() for name in RESOURCES}
        self.proxies: list[TcpProxy] = []
        """The relays' links to PostgreSQL, by relay number."""
        self.writer_proxies: list[TcpProxy] = []
        self.relays: list[RelayProcess] = []
        self.lake = ServiceProcess("lake-ingest", self.run_dir, marker="ingest")
        self.lake_settings = LakeSettings(
            root=str(self.run_dir / "lake"), topic_pattern=TOPIC_PATTERN
        )
        self.connector = ConnectorSettings(
            url=self.stack.connect.rest_url,
            name=CONNECTOR,
            database_port=self.stack.postgres.port,
            database_name=self.stack_settings.postgres_database,
            database_user=CDC_ROLE,
            slot_name=f"{CONNECTOR}_slot",
            topic_prefix=TOPIC_PREFIX,
            heartbeat_interval_ms=1000,
        )
        self.connect_client = ConnectClient(self.connector.url)
        self._relay_password = secrets.token_urlsafe(24)

    # --- start and stop ------------------------------------------------------------------

    def start(self) -> None:
        """A fresh stack, the database objects, the connector, two relays, the lake job."""
        self.lake.stop(timeout=60, group=True)  # left running by an interrupted run
        self.stack.destroy()  # an earlier run's stack, with its connector and topics
        shutil.rmtree(self.run_dir, ignore_errors=True)
        self.run_dir.mkdir(parents=True)
        self.stack.up()
        engine = sa.create_engine(self.stack.postgres.url())
        try:
            with engine.begin() as connection:
                outbox_migrations.upgrade(connection)
                outbox_migrations.create_cdc_role(connection, CDC_ROLE, self.stack.cdc_password())
                outbox_migrations.create_relay_role(connection, RELAY_ROLE, self._relay_password)
                for statement, parameters in schema_statements():
                    connection.execute(sa.text(statement), parameters)
        finally:
            engine.dispose()
        self.apply_connector()
        self.ensure_connector()
        for number in range(2):
            self.proxies.append(TcpProxy("127.0.0.1", self.stack.postgres.port))
            self.relays.append(self._relay(number))
            self.relays[-1].start()
        self.start_lake()

    def stop(self) -> None:
        """Stop everything this run started (a paused broker is resumed first)."""
        if self.stack.broker is not None:
            with contextlib.suppress(Exception):
                self.stack.broker.process.signal(signal.SIGCONT)
        for proxy in self.proxies:
            proxy.restore()
        for relay in self.relays:
            with contextlib.suppress(Exception):
                relay.terminate(timeout=30)
            relay.kill()
        self.lake.stop(timeout=60, group=True)
        for proxy in self.proxies + self.writer_proxies:
            proxy.stop()
        self.stack.down()

    def destroy(self) -> None:
        self.stack.destroy()

    # --- addresses -------------------------------------------------------------------------

    @property
    def conninfo(self) -> str:
        return self.stack.postgres.conninfo()

    @property
    def url(self) -> str:
        return self.stack.postgres.url()

    @property
    def bootstrap_servers(self) -> str:
        return self.stack.bootstrap_servers

    def proxied(self) -> tuple[TcpProxy, str, str]:
        """A TCP proxy of its own to PostgreSQL (a writer's network), with the psycopg
        conninfo and the SQLAlchemy URL through it."""
        proxy = TcpProxy("127.0.0.1", self.stack.postgres.port)
        self.writer_proxies.append(proxy)
        conninfo = psycopg.conninfo.make_conninfo(self.conninfo, port=proxy.port)
        url = sa.engine.make_url(self.url).set(port=proxy.port)
        return proxy, conninfo, url.render_as_string(hide_password=False)

    def lake_environment(self) -> dict[str, str]:
        return {
            "OUTBOX_LAKE_ROOT": self.lake_settings.root,
            "OUTBOX_LAKE_TOPIC_PATTERN": self.lake_settings.topic_pattern,
            "OUTBOX_LAKE_TRIGGER_SECONDS": "1",
            "OUTBOX_KAFKA_BOOTSTRAP_SERVERS": self.bootstrap_servers,
            "PYTHONPATH": str(ROOT),
        }

    def reconcile_environment(self) -> dict[str, str]:
        """What `outbox reconcile` needs to read this pipeline."""
        return {
            **self.lake_environment(),
            "OUTBOX_DATABASE_URL": self.url,
            "OUTBOX_RECONCILE_WORK_DIR": str(self.run_dir),
        }

    def _relay(self, number: int) -> RelayProcess:
        password = urllib.parse.quote(self._relay_password, safe="")
        database = self.stack_settings.postgres_database
        port = self.proxies[number].port
        http_port = free_port()
        return RelayProcess(
            env={
                "OUTBOX_DATABASE_URL": (
                    f"postgresql+psycopg://{RELAY_ROLE}:{password}@127.0.0.1:{port}/{database}"
                ),
                "OUTBOX_KAFKA_BOOTSTRAP_SERVERS": self.bootstrap_servers,
                "OUTBOX_RELAY_MODE": "auto",
                # The connector's topic prefix: the relay derives the heartbeat topic from it.
                "OUTBOX_CONNECT_TOPIC_PREFIX": TOPIC_PREFIX,
                "OUTBOX_RELAY_GRACE_SECONDS": "3",
                "OUTBOX_RELAY_HTTP_PORT": str(http_port),
                "OUTBOX_RELAY_LEADER_RETRY_SECONDS": "0.5",
                "OUTBOX_RELAY_DELIVERY_TIMEOUT_SECONDS": "10",
                "PYTHONPATH": str(ROOT),
            },
            log=self.run_dir / f"relay-{number}.log",
            port=http_port,
        )

    # --- what the watchdog watches ---------------------------------------------------------

    def components(self) -> list[Component]:
        """Every component of the pipeline, for the watchdog: how to tell that it stopped,
        its log, how to start it again. The connector is watched only while no fault acts on
        PostgreSQL, the broker or Connect (each of which fails its task until brought back)."""
        connect = self.stack.connect.process
        found = [
            Component(
                f"relay {number}",
                ("relay",),
                functools.partial(self._relay_stopped, number),
                relay.log,
                functools.partial(self._start_relay, number),
            )
            for number, relay in enumerate(self.relays)
        ]
        found.append(
            Component(
                "lake job",
                ("lake",),
                lambda: service_stopped(self.lake),
                self.lake.log_file,
                self._restart_lake,
            )
        )
        found.append(
            Component(
                "PostgreSQL",
                ("postgres",),
                lambda: None if self.stack.postgres.is_running() else "the postmaster is gone",
                self.stack.postgres.log_file,
                self._restart_postgres,
            )
        )
        if self.stack.broker is not None:
            broker = self.stack.broker
            found.append(
                Component(
                    "broker",
                    ("broker",),
                    lambda: service_stopped(broker.process),
                    broker.process.log_file,
                    lambda: f"started again (pid {broker.up().pid})",
                )
            )
        found.append(
            Component(
                "Connect",
                ("connect",),
                lambda: service_stopped(connect),
                connect.log_file,
                self.restart_connect,
            )
        )
        found.append(
            Component(
                "connector",
                ("connect", "postgres", "broker"),
                self._connector_stopped,
                connect.log_file,
                self._restart_connector,
            )
        )
        return found

    def _relay_stopped(self, number: int) -> str | None:
        process = self.relays[number].process
        if process is None or process.poll() is None:
            return None
        code = process.returncode
        how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exited with {code}"
        return f"pid {process.pid} {how}"

    def _start_relay(self, number: int) -> str:
        self.relays[number].start()
        process = self.relays[number].process
        return f"started again (pid {process.pid if process else None})"

    def _restart_lake(self) -> str:
        self.lake.stop(timeout=60, group=True)  # the Spark JVM may outlive the job's Python
        self.start_lake()
        return f"started again (pid {self.lake.pid()})"

    def _restart_postgres(self) -> str:
        self.restart_postgres()
        return f"started again (postmaster {self.stack.postgres.pid()})"

    def _connector_stopped(self) -> str | None:
        """The connector failed or missing, Connect running (Connect down is its own halt)."""
        if not self.stack.connect.process.is_running():
            return None
        state = self.connect_client.state(self.connector.name)
        if state is None:
            return "the connector is missing"
        if not (state.failed_tasks or state.connector == "FAILED"):
            return None
        tasks = "; ".join(
            f"task {task} {task_state}" + (f": {(trace or '').splitlines()[:1]}" if trace else "")
            for task, task_state, trace in state.tasks
        )
        return f"connector {state.connector} ({tasks or 'no task'})"

    def _restart_connector(self) -> str:
        if self.connect_client.state(self.connector.name) is None:
            self.apply_connector()
            return "applied again"
        self.connect_client.restart(self.connector.name)
        return "restarted with its tasks"

    # --- PostgreSQL ------------------------------------------------------------------------

    def kill_postgres(self) -> int:
        """``kill -9`` of the postmaster; its backends exit on their own once they notice
        (those still there after 20 s are killed, as a service manager would). Its pid."""
        pid = self.stack.postgres.pid()
        if pid is None:
            raise RuntimeError("PostgreSQL is not running")
        children = psutil.Process(pid).children(recursive=True)
        os.kill(pid, signal.SIGKILL)
        _, alive = psutil.wait_procs(children, timeout=20)
        for process in alive:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()
        psutil.wait_procs(alive, timeout=10)
        return pid

    def restart_postgres(self, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.stack.postgres.up()
                return
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(1)

    # --- Connect and the connector ----------------------------------------------------------

    def restart_connect(self, timeout: float = CONNECTOR_TIMEOUT_SECONDS) -> str:
        """Start Connect, and again while it exits during start-up, as a supervisor would: a
        worker that cannot reach the broker (killed or paused by an overlapping fault) stops
        after a minute ("Failed to connect to and describe Kafka cluster"). Each new attempt
        waits until the broker's port accepts connections. What it took, in words."""
        deadline = time.monotonic() + timeout
        exits: list[str] = []
        while True:
            try:
                self.stack.connect.up(
                    secrets={"OUTBOX_CONNECT_DATABASE_PASSWORD": self.cdc_password}
                )
            except StackError:
                if time.monotonic() > deadline or self.stack.connect.process.is_running():
                    raise
                exits.append(_cause(self.stack.connect.process.tail(30)))
                wait_until(
                    self._broker_accepts,
                    timeout=max(1.0, deadline - time.monotonic()),
                    what="the broker accepting connections, to start Connect again",
                )
                continue
            pid = self.stack.connect.process.pid()
            if not exits:
                return f"started (pid {pid})"
            return f"started (pid {pid}) after {len(exits)} exit(s) during start-up: " + "; ".join(
                dict.fromkeys(exits)
            )

    def _broker_accepts(self) -> bool:
        host, _, port = self.bootstrap_servers.split(",")[0].rpartition(":")
        try:
            with socket.create_connection((host, int(port)), timeout=1):
                return True
        except OSError:
            return False

    @property
    def cdc_password(self) -> str:
        return self.stack.cdc_password()

    def apply_connector(self) -> None:
        config = render_connector_config(self.connector, OutboxSettings())
        self.connect_client.apply(self.connector.name, config)

    def ensure_connector(self, timeout: float = CONNECTOR_TIMEOUT_SECONDS) -> str:
        """What an operator does until the connector runs: apply the connector if it is
        missing, restart it and its failed tasks; then wait until CDC confirms a newer
        position on its slot (RUNNING alone proves nothing: the relays in auto mode would
        deliver everything while CDC stood still, and the run would pass). What was done,
        in words. Connect itself must be running: a worker that stopped on its own is a halt
        for the watchdog to report, never started again here unseen. Past a minute without
        CDC, the operator's check for a hanging transaction on Connect's offsets topic (it
        holds the worker at start-up; `outbox connect unblock` aborts it, losing nothing):
        what it found is said, and on failure what is still open there."""
        done: dict[str, None] = {}  # what was done, once each, in order
        deadline = time.monotonic() + timeout
        next_unblock = time.monotonic() + UNBLOCK_AFTER_SECONDS
        while True:
            if not self.stack.connect.process.is_running():
                raise ConnectError(
                    f"Kafka Connect is not running (it stopped on its own); see "
                    f"{self.stack.connect.process.log_file}"
                )
            try:
                state = self.connect_client.state(self.connector.name)
                if state is None:
                    self.apply_connector()
                    done["connector applied"] = None
                elif state.running:
                    confirmed = self._cdc_confirms(min(deadline, time.monotonic() + 30))
                    if confirmed is not None:
                        done[f"CDC confirming ({confirmed})"] = None
                        return ", ".join(done)
                elif state.failed_tasks or state.connector == "FAILED":
                    self.connect_client.restart(self.connector.name)
                    done["failed tasks restarted"] = None
            except (ConnectError, OSError) as error:
                if time.monotonic() > deadline:
                    raise ConnectError(f"the connector is not running: {error}") from error
            if time.monotonic() > next_unblock:
                next_unblock = time.monotonic() + UNBLOCK_AFTER_SECONDS
                with contextlib.suppress(OutboxError):  # the broker may be down meanwhile
                    aborted, _ = unblock(
                        self.kafka, self.connector.offsets_topic, idle_seconds=IDLE_SECONDS
                    )
                    for transaction in aborted:
                        done[f"hanging transaction aborted: {transaction.describe()}"] = None
            if time.monotonic() > deadline:
                raise ConnectError(
                    f"the connector is not running, or CDC confirms nothing, after "
                    f"{timeout:.0f} s (slot {self.connector.slot_name} at "
                    f"{self._slot_text()}){self._offsets_topic_text()}; see "
                    f"{self.stack.connect.process.log_file}"
                )
            time.sleep(1)

    @property
    def kafka(self) -> KafkaSettings:
        return KafkaSettings(bootstrap_servers=self.bootstrap_servers)

    def _offsets_topic_text(self) -> str:
        """What holds Connect's offsets topic, if anything: for a failure's message."""
        try:
            held = open_transactions(self.kafka, self.connector.offsets_topic)
        except OutboxError as error:
            return f"; offsets topic not checked: {error}"
        return "".join(f"; {transaction.describe()}" for transaction in held)

    def slot_position(self) -> int | None:
        """Where the connector's slot is confirmed up to (bytes of WAL); None without it."""
        with psycopg.connect(self.conninfo, connect_timeout=5) as connection:
            row = connection.execute(
                "SELECT (confirmed_flush_lsn - '0/0'::pg_lsn)::bigint FROM pg_replication_slots "
                "WHERE slot_name = %s",
                (self.connector.slot_name,),
            ).fetchone()
        return None if row is None or row[0] is None else int(row[0])

    def _slot_text(self) -> str:
        try:
            position = self.slot_position()
        except psycopg.Error as error:
            return f"unknown: {type(error).__name__}"
        return "no slot" if position is None else _lsn(position)

    def _cdc_confirms(self, until: float) -> str | None:
        """Wait until the slot's confirmed position moves past where it is now (the writers'
        commits and the connector's heartbeat, every second, give it WAL to confirm): the
        position it reached, or None by ``until``."""
        start: int | None = None
        while time.monotonic() < until:
            try:
                position = self.slot_position()
            except psycopg.Error:
                position = None  # PostgreSQL restarting: ask again
            if start is None:
                start = position
            elif position is not None and position > start:
                return f"slot at {_lsn(position)}"
            time.sleep(0.5)
        return None

    # --- relays ----------------------------------------------------------------------------

    def claiming(self) -> list[int]:
        """The relays whose ``outbox_relay_leader`` says they lead. Two, for a moment, when
        one was cut off: it learns that it lost the lease only once it reaches PostgreSQL."""
        return [
            number
            for number, relay in enumerate(self.relays)
            if self.relay_running(number) and relay.metric("outbox_relay_leader") == 1.0
        ]

    def leader(self, timeout: float = 30) -> int | None:
        """The one relay that leads (waiting up to ``timeout`` for exactly one), or None."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            claiming = self.claiming()
            if len(claiming) == 1:
                return claiming[0]
            time.sleep(0.2)
        return None

    def relay_running(self, number: int) -> bool:
        process = self.relays[number].process
        return process is not None and process.poll() is None

    # --- the lake job ----------------------------------------------------------------------

    def start_lake(self) -> None:
        """Start ``outbox lake ingest`` and wait until its query has started."""
        log = self.lake.log_file
        offset = log.stat().st_size if log.exists() else 0
        self.lake.start(
            [*OUTBOX_COMMAND, "lake", "ingest"],
            env={**os.environ, **self.lake_environment()},
        )

        def started() -> bool:
            if not self.lake.is_running():
                raise RuntimeError(
                    f"the lake job exited at start; see {log}:\n" + "\n".join(self.lake.tail(15))
                )
            with log.open("rb") as text:
                text.seek(offset)
                return b"lake ingest started" in text.read()

        wait_until(started, timeout=LAKE_START_TIMEOUT_SECONDS, what="the lake job started")

    def kill_lake(self) -> int:
        """``kill -9`` of the lake job's process group (the Spark driver and its JVM)."""
        pid = self.lake.pid()
        if pid is None:
            raise RuntimeError("the lake job is not running")
        os.killpg(pid, signal.SIGKILL)
        wait_until(lambda: not self.lake.is_running(), timeout=30, what="the lake job gone")
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
        return pid

    def delete_lake_checkpoint(self) -> Path:
        checkpoint = Path(self.lake_settings.checkpoint)
        shutil.rmtree(checkpoint, ignore_errors=True)
        return checkpoint

    # --- the outbox ------------------------------------------------------------------------

    def undelivered(self) -> int:
        tables = OutboxSettings().tables
        with psycopg.connect(self.conninfo, connect_timeout=5) as connection:
            row = connection.execute(
                f"SELECT count(*) FROM {tables.qualified_outbox}"  # noqa: S608 - quoted name
            ).fetchone()
        return int(row[0]) if row else 0


def service_stopped(process: ServiceProcess) -> str | None:
    """None while ``process`` runs; else how it ended (its pid file names the last one)."""
    if process.is_running():
        return None
    try:
        pid = int(process.pid_file.read_text().strip())
    except (OSError, ValueError):
        return "not running (no pid file)"
    return exit_status(pid)


def _lsn(position: int) -> str:
    """A WAL position as PostgreSQL writes it (``0/1A8B108``)."""
    return f"{position >> 32:X}/{position & 0xFFFFFFFF:X}"


def _cause(log: list[str]) -> str:
    """The reason a Java service gave for stopping: its log's last ERROR line."""
    errors = [line for line in log if " ERROR " in line or line.startswith("org.apache")]
    return (errors[-1] if errors else (log[-1] if log else "no log"))[:200]
