"""CDC throughput, latency and memory on the native stack: Debezium with and without the
Event Router, into Apache Kafka.

Prints, from one run on the stack's broker (Apache Kafka, one KRaft node; or the cluster
``OUTBOX_KAFKA_BOOTSTRAP_SERVERS`` names) and Kafka Connect in exactly-once source mode:

1. events per second from commit to record on the broker, 100,000 small events written in
   one transaction, through the connector with the Outbox Event Router and through a raw
   connector (same rows, Debezium change events, no transform), and their ratio: a warm-up
   round of 20,000 through each first (Connect's JVM compiles its hot paths then), then
   ``--rounds`` (2) measured rounds, the order alternating, the median of each;
2. commit-to-broker latency p50/p95/p99 at a steady 1,000 and 5,000 events/s (10 and 50
   events every 10 ms, for 30 s each), with the Event Router, side by side: from the
   writer's commit to the moment a ``read_committed`` consumer read the record (Connect
   writes each batch as a Kafka transaction: a record is readable once it commits);
3. the resident memory (RSS) of the broker's and Connect's JVMs, side by side: idle (the
   stack up, before this run's load) and the peak while it ran. A JVM keeps the memory it
   grew into: the idle figure is the stack's at rest only when this run started the stack
   (the output says whether it did; ``outbox stack down`` first to measure that).

Both connectors read the same publication through slots of their own, one at a time.

    python -m benchmarks.cdc_throughput               # about 5 minutes
    python -m benchmarks.cdc_throughput --events 20000 --seconds 10
    python -m benchmarks.cdc_throughput --rates 1000  # latency at one rate only
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import threading
import time
import uuid
from typing import Any

import psycopg
import sqlalchemy as sa
from kafka import KafkaConsumer

import outbox_migrations
from benchmarks._probes import MemorySampler
from benchmarks._results import Results
from benchmarks._shared import (
    broker_name,
    connect_name,
    paced_writes,
    percentile,
    side_by_side,
    stack_names,
)
from outbox import Event, Outbox, OutboxSettings
from outbox.core.contract import event_id_of, topic_for
from outbox_connect import ConnectClient, ConnectorSettings, render_connector_config
from outbox_stack.local import LocalStack

DATABASE = "outbox_bench_cdc"
CDC_ROLE = "outbox_bench_cdc"
# The connectors' names start so (then a run id); an interrupted run's are removed.
CONNECTORS = ("benchrouted", "benchlatency", "benchraw")
WARM_UP_EVENTS = 20_000
"""Events of the warm-up round through each connector, before the measured rounds."""
TICK_SECONDS = 0.010
MIB = 2**20


def wait_for_records(bootstrap: str, topic: str, count: int, timeout: float = 300) -> float:
    """Read the topic until ``count`` records came; return the moment the last one arrived.

    Records read are counted, not end offsets compared: Connect writes transactions, and each
    commit marker takes an offset of its own, so offsets are not record counts."""
    consumer = KafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        isolation_level="read_committed",
        consumer_timeout_ms=200,
        max_poll_records=5000,
    )
    deadline = time.monotonic() + timeout
    seen = 0
    try:
        while seen < count:
            for _ in consumer:
                seen += 1
            if time.monotonic() > deadline:
                raise TimeoutError(f"{topic}: {seen} of {count} records after {timeout} s")
        return time.monotonic()
    finally:
        consumer.close()


def write_one_transaction(conninfo: str, aggregate_type: str, events: int) -> float:
    """Insert ``events`` small events in one transaction; return the commit's end time."""
    outbox = Outbox()
    with psycopg.connect(conninfo) as connection:
        with connection.transaction():
            for start in range(0, events, 1000):
                outbox.publish_many(
                    connection,
                    [
                        Event(aggregate_type, str(n % 100), "Tick", {"n": n})
                        for n in range(start, min(start + 1000, events))
                    ],
                )
        return time.monotonic()


def remove_leftovers(connect_url: str, conninfo: str, prefixes: tuple[str, ...]) -> None:
    """Delete the connectors an interrupted run left (their names start with one of
    ``prefixes``), and their replication slots (``slot_<name>``), which keep WAL."""
    client = ConnectClient(connect_url)
    for name in client.call("GET", "/connectors"):
        if name.startswith(prefixes):
            client.delete(name)
    with psycopg.connect(conninfo) as connection:
        slots = [
            row[0]
            for row in connection.execute("SELECT slot_name FROM pg_replication_slots")
            if row[0].startswith(tuple(f"slot_{prefix}" for prefix in prefixes))
        ]
    if slots:
        drop_slots(conninfo, slots)


def start_connector(settings: ConnectorSettings, config: dict[str, str]) -> ConnectClient:
    client = ConnectClient(settings.url)
    client.apply(settings.name, config)
    client.wait_running(settings.name, timeout=120)
    return client


def stop_connector(client: ConnectClient, conninfo: str, settings: ConnectorSettings) -> None:
    client.delete(settings.name)
    # A later run of this connector must not replay the backlog the slot kept meanwhile.
    drop_slots(conninfo, [settings.slot_name])


def measure_throughput(
    stack: LocalStack,
    conninfo: str,
    settings: ConnectorSettings,
    config: dict[str, str],
    topic: str,
    aggregate_type: str,
    events: int,
) -> float:
    client = start_connector(settings, config)
    start = write_one_transaction(conninfo, aggregate_type, events)
    done = wait_for_records(stack.bootstrap_servers, topic, events)
    stop_connector(client, conninfo, settings)
    return events / (done - start)


def measure_latency(stack: LocalStack, conninfo: str, rate: int, seconds: float) -> dict[str, Any]:
    """Commit-to-broker latency at ``rate`` events/s (a running connector with the Event
    Router): its figures, and the latencies (seconds, sorted) under ``latencies``."""
    aggregate_type = f"lat{uuid.uuid4().hex[:8]}"
    per_tick = max(1, round(rate * TICK_SECONDS))
    committed_at: dict[uuid.UUID, float] = {}
    # event id -> (when the consumer read it, the record's timestamp: Connect's produce time)
    arrived: dict[uuid.UUID, tuple[float, float]] = {}
    stop = threading.Event()
    stopped_at = [0.0]

    def consume() -> None:
        consumer = KafkaConsumer(
            topic_for(aggregate_type),
            bootstrap_servers=stack.bootstrap_servers,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            isolation_level="read_committed",
            fetch_max_wait_ms=10,
            consumer_timeout_ms=200,
        )
        try:
            while not stop.is_set() or len(arrived) < len(committed_at):
                for message in consumer:
                    arrived[event_id_of(message.headers)] = (time.time(), message.timestamp / 1000)
                if stop.is_set() and time.monotonic() > stopped_at[0] + 30:
                    break
        finally:
            consumer.close()

    reader = threading.Thread(target=consume)
    reader.start()
    started = time.monotonic()
    paced_writes(
        conninfo,
        aggregate_type,
        committed_at,
        events_per_tick=per_tick,
        seconds=seconds,
        tick_seconds=TICK_SECONDS,
    )
    written_in = time.monotonic() - started
    stopped_at[0] = time.monotonic()
    stop.set()
    reader.join(timeout=60)
    read = [event_id for event_id in committed_at if event_id in arrived]
    latencies = sorted(arrived[e][0] - committed_at[e] for e in read)
    captured = sorted(arrived[e][1] - committed_at[e] for e in read)
    if not latencies:
        raise RuntimeError(f"no record of the {len(committed_at):,} events at {rate}/s was read")
    figures: dict[str, Any] = {
        "events": len(committed_at),
        "read": len(read),
        "written_per_second": round(len(committed_at) / written_in, 1),
        "latencies": latencies,
    }
    for name, fraction in (("p50", 0.5), ("p95", 0.95), ("p99", 0.99)):
        figures[name] = round(percentile(latencies, fraction), 3)
        figures[f"record_timestamp_{name}"] = round(percentile(captured, fraction), 3)
    return figures


def drop_slots(conninfo: str, names: list[str]) -> None:
    """Drop these replication slots once their connectors let go of them."""
    with psycopg.connect(conninfo, autocommit=True) as connection:
        deadline = time.monotonic() + 60
        while connection.execute(
            "SELECT count(*) FROM pg_replication_slots WHERE slot_name = ANY(%s) AND active",
            (names,),
        ).fetchone() != (0,):
            if time.monotonic() > deadline:
                raise TimeoutError(f"replication slots {names} stay active")
            time.sleep(0.2)
        connection.execute(
            "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
            "WHERE slot_name = ANY(%s)",
            (names,),
        )


def main() -> None:
    parser = argparse.ArgumentParser(description="CDC throughput, latency and memory.")
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--seconds", type=float, default=30.0, help="writing time per rate")
    parser.add_argument(
        "--rates", type=int, nargs="+", default=[1000, 5000], help="events/s for the latency"
    )
    parser.add_argument(
        "--rounds", type=int, default=2, help="measured throughput rounds, after a warm-up"
    )
    parser.add_argument("--latency-only", action="store_true")
    parser.add_argument("--json", help="also write the figures to this JSON file")
    arguments = parser.parse_args()
    results = Results("cdc_throughput", arguments.json)
    stack = LocalStack()
    already = stack.connect.process.is_running() and (
        stack.broker is None or stack.broker.process.is_running()
    )
    stack.up()
    results.figures["stack_started_by_run"] = not already
    results.data["stack"] = stack_names(stack, connect=True)
    run(arguments, stack, results)
    results.write()


def prepare(stack: LocalStack) -> str:
    """A fresh database with the outbox and the CDC role, nothing left by an interrupted
    run; its conninfo."""
    cluster = stack.postgres
    remove_leftovers(stack.connect.rest_url, cluster.conninfo("postgres"), CONNECTORS)
    cluster.drop_database(DATABASE)
    cluster.ensure_database(DATABASE)
    engine = sa.create_engine(cluster.url(DATABASE))
    with engine.begin() as connection:
        outbox_migrations.upgrade(connection)
        outbox_migrations.create_cdc_role(connection, CDC_ROLE, stack.cdc_password())
    engine.dispose()
    return cluster.conninfo(DATABASE)


def run(arguments: argparse.Namespace, stack: LocalStack, results: Results) -> None:
    cluster = stack.postgres
    conninfo = prepare(stack)
    outbox_settings = OutboxSettings()

    # Each connector has a name of its own in each run: Connect keeps a deleted connector's
    # source offsets, and Debezium refuses to start from an offset its new slot cannot serve.
    run_id = uuid.uuid4().hex[:6]

    def connector(prefix: str, round_: int = 0) -> ConnectorSettings:
        name = f"{prefix}{run_id}r{round_}"
        return ConnectorSettings(
            url=stack.connect.rest_url,
            name=name,
            database_port=cluster.port,
            database_name=DATABASE,
            database_user=CDC_ROLE,
            slot_name=f"slot_{name}",
            topic_prefix=name,
        )

    latency = connector("benchlatency")
    latency_config = render_connector_config(latency, outbox_settings)

    def throughput(which: str, round_: int, events: int) -> float:
        """Events/s of one round through a new connector: ``routed`` (the Event Router) or
        ``raw`` (Debezium's change events, no transform)."""
        if which == "routed":
            routed = connector("benchrouted", round_)
            aggregate_type = f"thr{uuid.uuid4().hex[:8]}"
            config = render_connector_config(routed, outbox_settings)
            return measure_throughput(
                stack, conninfo, routed, config, topic_for(aggregate_type), aggregate_type, events
            )
        raw = connector("benchraw", round_)
        raw_config = {
            key: value
            for key, value in render_connector_config(raw, outbox_settings).items()
            if not key.startswith("transforms")
        }
        raw_config["value.converter"] = "org.apache.kafka.connect.json.JsonConverter"
        raw_config["value.converter.schemas.enable"] = "false"
        topic = f"{raw.topic_prefix}.outbox.outbox"
        return measure_throughput(
            stack, conninfo, raw, raw_config, topic, f"raw{uuid.uuid4().hex[:8]}", events
        )

    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores; PostgreSQL 15 -> "
        f"{connect_name()} (exactly-once source) -> {broker_name(stack)}; "
        f"{arguments.events:,} events in one transaction"
    )
    pids = {"broker": stack.broker.process.pid() if stack.broker is not None else None}
    pids["connect"] = stack.connect.process.pid()
    memory = MemorySampler({name: pid for name, pid in pids.items() if pid is not None})
    idle = memory.idle()
    memory.start()
    try:
        if not arguments.latency_only:
            # Connect's JVM compiles its hot paths during the first run through it: a
            # warm-up round of each first (not counted), then the measured rounds, the
            # order alternating so that neither path always runs first.
            for which in ("routed", "raw"):
                throughput(which, 0, min(arguments.events, WARM_UP_EVENTS))
            rounds: dict[str, list[float]] = {"routed": [], "raw": []}
            for round_ in range(1, arguments.rounds + 1):
                order = ("routed", "raw") if round_ % 2 else ("raw", "routed")
                for which in order:
                    rounds[which].append(throughput(which, round_, arguments.events))
            with_router = statistics.median(rounds["routed"])
            without_router = statistics.median(rounds["raw"])
            ratio = with_router / without_router
            print(f"with the Outbox Event Router : {with_router:>9,.0f} events/s")
            print(f"raw change events            : {without_router:>9,.0f} events/s")
            print(f"ratio (router / raw)         : {ratio:>9.2f}   target >= 0.9")
            results.figures.update(
                events=arguments.events,
                router_events_per_second=round(with_router, 1),
                raw_events_per_second=round(without_router, 1),
                ratio=round(ratio, 3),
                rounds={which: [round(v, 1) for v in found] for which, found in rounds.items()},
            )
        client = start_connector(latency, latency_config)
        by_rate = {
            rate: measure_latency(stack, conninfo, rate, arguments.seconds)
            for rate in arguments.rates
        }
        stop_connector(client, conninfo, latency)
    finally:
        peak = memory.stop()
    print(
        f"commit-to-broker latency, Event Router, {arguments.seconds:g} s per rate "
        "(target p99 < 1,000 ms at 1,000 events/s):"
    )
    side_by_side(
        "events/s offered",
        {
            f"{rate:,}/s": {
                "written events/s": found["written_per_second"],
                "events read": found["read"],
                "p50 ms": found["p50"] * 1000,
                "p95 ms": found["p95"] * 1000,
                "p99 ms": found["p99"] * 1000,
                "to record timestamp p50 ms": found["record_timestamp_p50"] * 1000,
                "to record timestamp p99 ms": found["record_timestamp_p99"] * 1000,
            }
            for rate, found in by_rate.items()
        },
    )
    results.figures["commit_to_broker_seconds"] = {
        str(rate): {name: value for name, value in found.items() if name != "latencies"}
        for rate, found in by_rate.items()
    }
    resident = {
        name: {"idle": round(idle[name] / MIB, 1), "peak": round(peak[name] / MIB, 1)}
        for name in idle
        if name in peak
    }
    print("resident memory (RSS):")
    side_by_side(
        "MiB",
        {
            name: {"idle, before the load": found["idle"], "peak, during the run": found["peak"]}
            for name, found in resident.items()
        },
    )
    if results.figures["stack_started_by_run"]:
        print("  (idle: the stack as this run started it)")
    else:
        print("  (idle: the stack was already running; a JVM keeps the memory it grew into)")
    if stack.broker is None:
        print("  (the broker is external: its memory is not measured here)")
    results.figures["resident_memory_mib"] = resident
    cluster.drop_database(DATABASE)


if __name__ == "__main__":
    main()
