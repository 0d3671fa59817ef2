"""The polling relay in tests: a migrated database of its own, relays in threads or processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import sqlalchemy as sa

import outbox_migrations
from outbox import OutboxSettings
from outbox.core.tables import DEFAULT_CDC_TOPIC_PREFIX
from outbox.settings import KafkaSettings
from outbox_relay.service import Relay
from outbox_relay.settings import RelaySettings
from tests.fix_postgres import ROOT, ScratchDatabase, free_port
from tests.fix_stack import KafkaServices

FAST = {
    "idle_seconds": 0.05,
    "leader_retry_seconds": 0.5,
    "grace_seconds": 2.0,
    "retry_backoff_seconds": 0.2,
    "max_backoff_seconds": 2.0,
    "delivery_timeout_seconds": 10.0,
    "http_port": 0,
}


def sample(relay: Relay, name: str, **labels: str) -> float:
    """One sample of a relay's metrics in this process (0 when it has none yet)."""
    return relay.metrics.registry.get_sample_value(name, labels) or 0.0


def wait_until(condition: Callable[[], bool], *, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {what}")
        time.sleep(0.05)


@dataclass
class RelayProcess:
    """``outbox relay run`` as ops run it: a process, settings in its environment."""

    env: dict[str, str]
    log: Path
    port: int
    process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "outbox_cli.main", "relay", "run"],
                env={**os.environ, **self.env},
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def metric(self, name: str) -> float:
        """A sample of /metrics (0 when the server does not answer yet)."""
        try:
            with urllib.request.urlopen(
                f"http://127.0.0.1:{self.port}/metrics", timeout=2
            ) as answer:
                text = answer.read().decode()
        except OSError:
            return 0.0
        for line in text.splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
        return 0.0

    def probe(self, path: str) -> int:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=2) as answer:
                return int(answer.status)
        except urllib.error.HTTPError as error:
            return int(error.code)
        except OSError:
            return 0

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)

    def terminate(self, timeout: float = 60) -> int:
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=timeout)


@dataclass
class RelayBench:
    """A migrated database of the test's own, on the suite's Postgres and broker."""

    database: ScratchDatabase
    kafka: KafkaServices
    tmp: Path
    processes: list[RelayProcess] = field(default_factory=list)

    def settings(self, **overrides: object) -> RelaySettings:
        return RelaySettings(**{**FAST, **overrides})  # type: ignore[arg-type]

    @contextmanager
    def in_thread(
        self,
        *,
        database_url: str | None = None,
        bootstrap_servers: KafkaSettings | str | None = None,
        cdc_topic_prefix: str = DEFAULT_CDC_TOPIC_PREFIX,
        **overrides: object,
    ) -> Iterator[Relay]:
        """A relay running in a thread of the test, stopped (and its batch drained) at exit;
        ``cdc_topic_prefix``: the connector's, when the relay watches CDC."""
        relay = Relay(
            self.settings(**overrides),
            database_url=database_url or self.database.url,
            kafka=bootstrap_servers or self.kafka.bootstrap_servers,
            tables=OutboxSettings().tables,
            cdc_topic_prefix=cdc_topic_prefix,
        )
        stop = threading.Event()
        thread = threading.Thread(target=relay.run, args=(stop,), name="relay-under-test")
        thread.start()
        try:
            yield relay
        finally:
            stop.set()
            thread.join(timeout=60)
            assert not thread.is_alive(), "the relay did not stop within 60 s"

    def process(self, **env: str) -> RelayProcess:
        port = free_port()
        relay = RelayProcess(
            env={
                "OUTBOX_DATABASE_URL": self.database.url,
                "OUTBOX_KAFKA_BOOTSTRAP_SERVERS": self.kafka.bootstrap_servers,
                "OUTBOX_RELAY_HTTP_PORT": str(port),
                "OUTBOX_RELAY_IDLE_SECONDS": "0.05",
                "OUTBOX_RELAY_LEADER_RETRY_SECONDS": "0.5",
                "OUTBOX_RELAY_DELIVERY_TIMEOUT_SECONDS": "10",
                "OUTBOX_RELAY_RETRY_BACKOFF_SECONDS": "0.2",
                "OUTBOX_RELAY_MAX_BACKOFF_SECONDS": "2",
                "PYTHONPATH": str(ROOT),
                **env,
            },
            log=self.tmp / f"relay-{len(self.processes)}.log",
            port=port,
        )
        self.processes.append(relay)
        relay.start()
        return relay

    def undelivered(self) -> int:
        with self.database.connect() as connection:
            row = connection.execute("SELECT count(*) FROM outbox.outbox").fetchone()
        assert row is not None
        return int(row[0])


@pytest.fixture
def relay_bench(kafka_services: KafkaServices, tmp_path: Path) -> Iterator[RelayBench]:
    database = ScratchDatabase(kafka_services.cluster, f"outbox_test_relay_{uuid.uuid4().hex[:8]}")
    database.cluster.ensure_database(database.name)
    engine = sa.create_engine(database.url)
    with engine.begin() as connection:
        outbox_migrations.upgrade(connection)
    engine.dispose()
    bench = RelayBench(database, kafka_services, tmp_path)
    try:
        yield bench
    finally:
        for process in bench.processes:
            process.kill()
        database.cluster.drop_database(database.name)
