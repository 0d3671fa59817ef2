"""Polling relay throughput against a bare kafka-python producer, on the same broker.

Prints, from one run on the native stack (PostgreSQL and the broker; started if needed):

1. events per second of a running relay draining 100,000 small events committed at once
   (read, publish with acks=all, wait for the acknowledgements, delete), and of a bare
   kafka-python producer with the same settings sending records of the same size (already
   built in memory: no database at all), and their ratio; the best of ``--rounds``
   interleaved rounds. Both are warm when their clock starts: connected, and one record
   already sent to the topic (the relay's start-up, its checks and the lease, are not
   throughput: a relay runs for weeks);
2. the relay's events per second while a transaction stays open the whole time (it holds
   PostgreSQL's xmin: deleted rows cannot be vacuumed and the relay's floor cannot move),
   and once it has ended;
3. scale-out: events per second of 1, 2 and 3 relays side by side (``--relays``), each an
   ``outbox relay run`` process of its own as ops run them, sharing the outbox's slices,
   draining the same number of events over 100 aggregates; each ratio to one relay.

    python -m benchmarks.relay_throughput                 # about 3 minutes
    python -m benchmarks.relay_throughput --events 20000 --rounds 1 --relays 1,2

The broker is the stack's Apache Kafka (one KRaft node), or the cluster
``OUTBOX_KAFKA_BOOTSTRAP_SERVERS`` names.
"""

from __future__ import annotations

import argparse
import os
import platform
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
from kafka import KafkaProducer

from benchmarks._probes import CpuMeter
from benchmarks._results import Results
from benchmarks._shared import (
    broker_name,
    delete_topics,
    free_port,
    fresh_database,
    postgres_and_broker,
    stack_names,
)
from outbox import Event, Outbox, OutboxSettings
from outbox.core.contract import record_for, topic_for
from outbox_relay.collector import collect_young_rarely
from outbox_relay.database import OutboxRow, RelayDatabase
from outbox_relay.probe import scrape
from outbox_relay.producer import ContractProducer
from outbox_relay.service import Relay
from outbox_relay.settings import RelaySettings
from outbox_relay.slices import SLICES
from outbox_stack.local import LocalStack

DATABASE = "outbox_bench_relay"


def fill(conninfo: str, aggregate_type: str, events: int, *, per_transaction: int = 5000) -> None:
    outbox = Outbox()
    with psycopg.connect(conninfo) as connection:
        for start in range(0, events, per_transaction):
            with connection.transaction():
                outbox.publish_many(
                    connection,
                    [
                        Event(aggregate_type, str(n % 100), "Tick", {"n": n})
                        for n in range(start, min(start + per_transaction, events))
                    ],
                )


def records_of(conninfo: str, aggregate_type: str, topic_suffix: str) -> list[Any]:
    with psycopg.connect(conninfo) as connection:
        rows = connection.execute(
            "SELECT id, aggregatetype, aggregateid, type, payload::text, headers::text, "
            "traceparent, position FROM outbox.outbox WHERE aggregatetype = %s ORDER BY position",
            (aggregate_type,),
        ).fetchall()
    return [
        record_for(
            event_id=row[0],
            aggregate_type=row[1] + topic_suffix,
            aggregate_id=row[2],
            event_type=row[3],
            payload_text=row[4],
            headers_text=row[5],
            traceparent=row[6],
            position=row[7],
        )
        for row in rows
    ]


def relay_rows_of(url: str, aggregate_type: str, topic_suffix: str) -> list[OutboxRow]:
    """The rows as the relay reads them (its own statement), on a topic of their own."""
    database = RelayDatabase(url, OutboxSettings().tables, lease_seconds=10)
    database.connect()
    try:
        database.join()
        database.balance()  # every slice: no relay runs
        rows = database.read(0, 10_000_000)
    finally:
        database.close()
    return [
        row._replace(aggregate_type=row.aggregate_type + topic_suffix)
        for row in rows
        if row.aggregate_type == aggregate_type
    ]


def relay_producer_alone(bootstrap: str, rows: list[OutboxRow], settings: RelaySettings) -> float:
    """The relay's Kafka side without its database: its producer sends the rows batch by
    batch (``batch_size``), waiting for each batch's acknowledgements, as the relay does."""
    producer = ContractProducer(bootstrap, settings)
    try:
        producer.publish(rows[:1])  # warm-up, as the bare producer's
        started = time.monotonic()
        for start in range(0, len(rows), settings.batch_size):
            outcome = producer.publish(rows[start : start + settings.batch_size])
            if outcome.failure is not None or outcome.retry or outcome.rejected:
                raise RuntimeError(f"the broker did not take a batch: {outcome}")
        return len(rows) / (time.monotonic() - started)
    finally:
        producer.close()


def bare_producer(bootstrap: str, records: list[Any], settings: RelaySettings) -> float:
    producer = KafkaProducer(
        bootstrap_servers=bootstrap,
        acks="all",
        enable_idempotence=True,
        linger_ms=settings.linger_ms,
        batch_size=262_144,
        max_request_size=settings.max_request_bytes,
    )
    producer.send(records[0].topic, key=b"warm-up", value=b"{}").get(timeout=30)
    started = time.monotonic()
    for record in records:
        producer.send(
            record.topic, key=record.key, value=record.value, headers=list(record.headers)
        )
    producer.flush()
    elapsed = time.monotonic() - started
    producer.close()
    return len(records) / elapsed


def outbox_is_empty(connection: psycopg.Connection[Any]) -> bool:
    return connection.execute("SELECT EXISTS (SELECT FROM outbox.outbox)").fetchone() == (False,)


def wait_published(relay: Relay, count: float, timeout: float) -> None:
    """Until the relay has deleted ``count`` rows after their acknowledgement (its
    ``outbox_relay_published_total`` counts a batch once its delete returned).

    The clock's stop, read from the relay's own counter rather than by polling the table:
    ``SELECT EXISTS (SELECT FROM outbox)`` every 20 ms cost PostgreSQL 0.33 s of CPU per
    100,000-event drain (a scan over the deleted rows not yet vacuumed, each time) and the
    relay's process 50 wake-ups a second, on the two cores the relay runs on.
    """
    deadline = time.monotonic() + timeout
    while published(relay) < count:
        if time.monotonic() > deadline:
            raise TimeoutError(f"the relay did not publish {count:.0f} events in {timeout:.0f} s")
        time.sleep(0.005)  # an in-process counter: no event to await


def published(relay: Relay) -> float:
    return relay.metrics.registry.get_sample_value("outbox_relay_published_total") or 0.0


def relay_drain(
    url: str,
    bootstrap: str,
    settings: RelaySettings,
    conninfo: str,
    aggregate_type: str,
    events: int,
    *,
    held_open: bool = False,
) -> float:
    """Events/s of a running relay draining ``events`` committed at once.

    Warmed up as the bare producer is: before the clock starts, the relay has connected,
    taken the lease, created its producer and sent one record to the same topic. Then
    ``events`` are committed in one transaction and the clock runs from that commit until
    the relay has deleted every row after its record's acknowledgement (the relay's idle
    poll, ``idle_seconds``, counts against it); then the outbox must be empty.
    ``held_open``: a transaction holds an xid from before the events until after the drain
    (PostgreSQL's xmin stays back: deleted rows cannot be vacuumed, the floor cannot move).
    """
    relay = Relay(settings, database_url=url, kafka=bootstrap, tables=OutboxSettings().tables)
    stop = threading.Event()
    thread = threading.Thread(target=relay.run, args=(stop,))
    with (
        psycopg.connect(conninfo, autocommit=True) as connection,
        psycopg.connect(conninfo) as holder,
    ):
        fill(conninfo, aggregate_type, 1)
        thread.start()
        try:
            wait_published(relay, 1, 120)
            if held_open:
                holder.execute("CREATE TEMP TABLE hold (x int)")
                holder.execute("INSERT INTO hold VALUES (1)")  # takes an xid
            fill(conninfo, aggregate_type, events, per_transaction=events)
            started = time.monotonic()
            wait_published(relay, events + 1, 600)
            elapsed = time.monotonic() - started
            holder.rollback()
            if not outbox_is_empty(connection):
                raise RuntimeError("the relay counted every event published, rows are left")
        finally:
            stop.set()
            thread.join(timeout=60)
    return events / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description="Polling relay vs bare producer.")
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--relays", default="1,2,3", help="scale-out: how many relays side by side, each run"
    )
    parser.add_argument("--json", help="also write the figures to this JSON file")
    arguments = parser.parse_args()
    # The garbage collector's thresholds of `outbox relay run`, for the whole process: the bare
    # producer and the relay's producer alone run under them too.
    collect_young_rarely()
    results = Results("relay_throughput", arguments.json)
    stack = postgres_and_broker()
    results.data["stack"] = stack_names(stack, connect=False)
    run(arguments, stack, results)
    results.write()


def run(arguments: argparse.Namespace, stack: LocalStack, results: Results) -> None:
    made: list[str] = []

    def fresh_type(prefix: str) -> str:
        made.append(f"{prefix}{uuid.uuid4().hex[:8]}")
        return made[-1]

    try:
        measure(arguments, stack, results, fresh_type)
    finally:
        suffixes = ("", "-bare", "-alone")
        delete_topics(
            stack.bootstrap_servers, [topic_for(t + suffix) for t in made for suffix in suffixes]
        )


def measure(
    arguments: argparse.Namespace,
    stack: LocalStack,
    results: Results,
    fresh_type: Callable[[str], str],
) -> None:
    cluster = stack.postgres
    url = fresh_database(stack, DATABASE)
    conninfo = cluster.conninfo(DATABASE)
    settings = RelaySettings(http_port=0)
    bootstrap = stack.bootstrap_servers
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores; PostgreSQL 15 and "
        f"{broker_name(stack)}; "
        f"{arguments.events:,} events of ~60 bytes; relay batch {settings.batch_size}, "
        f"linger {settings.linger_ms} ms, acks=all, idempotent"
    )
    relay_figures, bare_figures, alone_figures = [], [], []
    for _ in range(arguments.rounds):
        aggregate_type = fresh_type("b")
        fill(conninfo, aggregate_type, arguments.events)
        records = records_of(conninfo, aggregate_type, "-bare")
        rows = relay_rows_of(url, aggregate_type, "-alone")
        with psycopg.connect(conninfo, autocommit=True) as connection:
            connection.execute("DELETE FROM outbox.outbox")
        bare_figures.append(bare_producer(bootstrap, records, settings))
        alone_figures.append(relay_producer_alone(bootstrap, rows, settings))
        relay_figures.append(
            relay_drain(url, bootstrap, settings, conninfo, aggregate_type, arguments.events)
        )
    relay_best, bare_best = max(relay_figures), max(bare_figures)
    print(
        f"bare kafka-python producer : {bare_best:>9,.0f} events/s  (rounds: "
        + ", ".join(f"{f:,.0f}" for f in bare_figures)
        + ")"
    )
    print(
        f"polling relay              : {relay_best:>9,.0f} events/s  (rounds: "
        + ", ".join(f"{f:,.0f}" for f in relay_figures)
        + ")"
    )
    alone_best = max(alone_figures)
    print(
        f"relay's producer, no database: {alone_best:>7,.0f} events/s  (rounds: "
        + ", ".join(f"{f:,.0f}" for f in alone_figures)
        + f"; {alone_best / bare_best:.2f}x bare: the relay's Kafka side alone)"
    )
    print(f"ratio relay / bare         : {relay_best / bare_best:>9.2f}   target >= 0.9")
    results.figures.update(
        events=arguments.events,
        bare_producer_events_per_second=round(bare_best, 1),
        relay_events_per_second=round(relay_best, 1),
        ratio=round(relay_best / bare_best, 3),
        relay_producer_alone_events_per_second=round(alone_best, 1),
        target=0.9,
    )

    held = relay_drain(
        url,
        bootstrap,
        settings,
        conninfo,
        fresh_type("h"),
        arguments.events,
        held_open=True,
    )
    with psycopg.connect(conninfo, autocommit=True) as connection:
        connection.execute("VACUUM outbox.outbox")
    after = relay_drain(url, bootstrap, settings, conninfo, fresh_type("a"), arguments.events)
    print(f"relay, transaction held open: {held:>9,.0f} events/s")
    print(f"relay, after it ended        : {after:>9,.0f} events/s")
    results.figures.update(
        relay_held_open_events_per_second=round(held, 1),
        relay_after_events_per_second=round(after, 1),
    )
    scale_out(arguments, stack, url, conninfo, results, fresh_type)
    cluster.drop_database(DATABASE)


class RelayProcesses:
    """``count`` relays as ``outbox relay run`` processes (settings in their environment,
    the database's password never on a command line), their ``/metrics`` on free ports."""

    def __init__(self, count: int, url: str, bootstrap: str) -> None:
        self.ports = [free_port() for _ in range(count)]
        self.processes = [
            subprocess.Popen(
                [sys.executable, "-m", "outbox_cli.main", "relay", "run"],
                env={
                    **os.environ,
                    "OUTBOX_DATABASE_URL": url,
                    "OUTBOX_KAFKA_BOOTSTRAP_SERVERS": bootstrap,
                    "OUTBOX_RELAY_HTTP_PORT": str(port),
                    "OUTBOX_LOG_LEVEL": "WARNING",
                },
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            for port in self.ports
        ]

    def metrics(self, name: str) -> list[float]:
        """One metric of each relay (0 from one that does not answer yet)."""
        values = []
        for port in self.ports:
            try:
                samples = scrape(f"http://127.0.0.1:{port}", timeout_seconds=2)
            except OSError:
                samples = []
            values.append(next((s.value for s in samples if s.name == name), 0.0))
        return values

    def metric(self, name: str) -> float:
        """The sum of one metric over every relay."""
        return sum(self.metrics(name))

    def wait_for(self, name: str, value: float, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while self.metric(name) < value:
            if any(process.poll() is not None for process in self.processes):
                raise RuntimeError("a relay process ended")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{name} did not reach {value:.0f} in {timeout:.0f} s")
            time.sleep(0.02)  # other processes' counters: no event to await

    def stop(self) -> None:
        for process in self.processes:
            process.send_signal(signal.SIGTERM)
        for process in self.processes:
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)


def relays_drain(
    count: int, stack: LocalStack, url: str, conninfo: str, events: int, aggregate_type: str
) -> tuple[float, dict[str, float]]:
    """Events/s of ``count`` relay processes draining ``events`` committed at once, warm:
    every relay holds its share of the slices and has published before the clock starts;
    and the cores each part used meanwhile (the relays together, PostgreSQL, the broker)."""
    bootstrap = stack.bootstrap_servers
    relays = RelayProcesses(count, url, bootstrap)
    try:
        deadline = time.monotonic() + 120
        while sum(shares := relays.metrics("outbox_relay_slices")) < SLICES or min(shares) == 0:
            if time.monotonic() > deadline:
                raise TimeoutError(f"the relays did not share the slices: {shares}")
            time.sleep(0.05)  # other processes' state: no event to await
        fill(conninfo, aggregate_type, 1000)  # 100 aggregates: every relay publishes some
        relays.wait_for("outbox_relay_published_total", 1000, 120)
        fill(conninfo, aggregate_type, events, per_transaction=events)
        meters = [
            CpuMeter({f"relay {n}": p.pid for n, p in enumerate(relays.processes)}),
            CpuMeter(_servers(stack)),
        ]
        for meter in meters:
            meter.start()
        started = time.monotonic()
        relays.wait_for("outbox_relay_published_total", 1000 + events, 600)
        rate = events / (time.monotonic() - started)
        cores = {**meters[1].stop(), "relays": round(sum(meters[0].stop().values()), 2)}
        return rate, cores
    finally:
        relays.stop()


def _servers(stack: LocalStack) -> dict[str, int]:
    """PostgreSQL's postmaster (its backends are its children) and the broker's JVM."""
    pids = {"postgres": stack.postgres.pid()}
    if stack.broker is not None:
        pids["broker"] = stack.broker.process.pid()
    return {name: pid for name, pid in pids.items() if pid is not None}


def scale_out(
    arguments: argparse.Namespace,
    stack: LocalStack,
    url: str,
    conninfo: str,
    results: Results,
    fresh_type: Callable[[str], str],
) -> None:
    counts = [int(n) for n in arguments.relays.split(",") if n.strip()]
    figures = {
        count: relays_drain(count, stack, url, conninfo, arguments.events, fresh_type("x"))
        for count in counts
    }
    one = figures[1][0] if 1 in figures else None
    for count, (rate, cores) in figures.items():
        ratio = f" ({rate / one:.2f}x one relay)" if one else ""
        used = ", ".join(f"{name} {value:.2f}" for name, value in cores.items())
        print(f"{count} relay process(es), shared : {rate:>9,.0f} events/s{ratio}; cores: {used}")
    results.figures["relays_events_per_second"] = {
        str(count): round(rate, 1) for count, (rate, _) in figures.items()
    }
    results.figures["relays_cores"] = {str(count): cores for count, (_, cores) in figures.items()}


if __name__ == "__main__":
    main()
