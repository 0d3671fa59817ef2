"""CDC throughput and latency on the native stack: Debezium with and without the Event Router.

Prints, from one run:

1. events per second from commit to record on the broker, 100,000 small events written in
   one transaction, through the connector with the Outbox Event Router and through a raw
   connector (same rows, Debezium change events, no transform), and their ratio;
2. commit-to-broker latency p50/p95/p99 at a steady 1,000 events/s (10 events every 10 ms,
   for 30 s), with the Event Router.

Both connectors read the same publication through slots of their own, one at a time.

    python -m benchmarks.cdc_throughput               # about 3 minutes per engine
    python -m benchmarks.cdc_throughput --events 20000 --seconds 10
    python -m benchmarks.cdc_throughput --engine s3   # one broker engine only

By default it runs once per engine of the local broker (``memory``, then ``s3``: the stack's
default, left running; Connect restarts with the broker) and ends with the headline figures
side by side.
"""

from __future__ import annotations

import argparse
import os
import platform
import threading
import time
import uuid

import psycopg
import sqlalchemy as sa
from kafka import KafkaConsumer

import outbox_migrations
from benchmarks._results import Results
from benchmarks._shared import engines_side_by_side, paced_writes, percentile
from outbox import Event, Outbox, OutboxSettings
from outbox.core.contract import event_id_of, topic_for
from outbox_connect import ConnectClient, ConnectorSettings, render_connector_config
from outbox_stack.local import LocalStack, stack_on

DATABASE = "outbox_bench_cdc"
CDC_ROLE = "outbox_bench_cdc"


def wait_for_records(bootstrap: str, topic: str, count: int, timeout: float = 300) -> float:
    """Read the topic until ``count`` records came; return the moment the last one arrived.

    (Counting records read, not end offsets: Tansu's end offsets are not record counts.)
    """
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


def measure_throughput(
    stack: LocalStack,
    conninfo: str,
    settings: ConnectorSettings,
    config: dict[str, str],
    topic: str,
    aggregate_type: str,
    events: int,
) -> float:
    client = ConnectClient(settings.url)
    client.apply(settings.name, config)
    client.wait_running(settings.name, timeout=120)
    committed = write_one_transaction(conninfo, aggregate_type, events)
    start = committed
    done = wait_for_records(stack.bootstrap_servers, topic, events)
    client.delete(settings.name)
    # A later run of this connector must not replay the backlog the slot kept meanwhile.
    drop_slots(conninfo, [settings.slot_name])
    return events / (done - start)


def measure_latency(
    stack: LocalStack,
    conninfo: str,
    settings: ConnectorSettings,
    config: dict[str, str],
    seconds: float,
) -> list[float]:
    client = ConnectClient(settings.url)
    client.apply(settings.name, config)
    client.wait_running(settings.name, timeout=120)
    aggregate_type = f"lat{uuid.uuid4().hex[:8]}"
    committed_at: dict[uuid.UUID, float] = {}
    latencies: list[float] = []
    captured: list[float] = []  # commit -> Debezium's record timestamp (its processing time)
    stop = threading.Event()

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
        while not stop.is_set() or len(latencies) < len(committed_at):
            for message in consumer:
                arrived = time.time()
                event_id = event_id_of(message.headers)
                if event_id in committed_at:
                    latencies.append(arrived - committed_at[event_id])
                    captured.append(message.timestamp / 1000 - committed_at[event_id])
            if stop.is_set() and time.monotonic() > stop_time + 30:
                break
        consumer.close()

    stop_time = 0.0
    reader = threading.Thread(target=consume)
    reader.start()
    # 10 events every 10 ms: 1,000 events/s.
    paced_writes(conninfo, aggregate_type, committed_at, events_per_tick=10, seconds=seconds)
    stop_time = time.monotonic()
    stop.set()
    reader.join(timeout=60)
    client.delete(settings.name)
    # A later run of this connector must not replay the backlog the slot kept meanwhile.
    drop_slots(conninfo, [settings.slot_name])
    captured.sort()
    print(
        "  of which commit -> Debezium's record timestamp: "
        f"p50 {percentile(captured, 0.5) * 1000:.0f} ms, "
        f"p95 {percentile(captured, 0.95) * 1000:.0f} ms, "
        f"p99 {percentile(captured, 0.99) * 1000:.0f} ms"
    )
    return sorted(latencies)


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
    parser = argparse.ArgumentParser(description="CDC throughput and latency.")
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--latency-only", action="store_true")
    parser.add_argument("--json", help="also write the figures to this JSON file")
    parser.add_argument("--engine", choices=["both", "memory", "s3"], default="both")
    arguments = parser.parse_args()
    results = Results("cdc_throughput", arguments.json)
    figures: dict[str, dict[str, float]] = {}
    # The flat figures are the last engine's: s3, the stack's default (the report reads them).
    for engine in ("memory", "s3") if arguments.engine == "both" else (arguments.engine,):
        stack = stack_on(engine)
        stack.up()
        if stack.broker is None:  # an external cluster: the engine does not apply
            figures["external"] = run(arguments, stack, results)
            break
        print(f"== broker: {stack.broker.describe()}")
        figures[engine] = run(arguments, stack, results)
    results.figures["engines"] = engines_side_by_side(figures, "figure")
    results.write()


def run(arguments: argparse.Namespace, stack: LocalStack, results: Results) -> dict[str, float]:
    """One run on ``stack``'s broker; its headline figures by name."""
    figures: dict[str, float] = {}
    cluster = stack.postgres
    client = ConnectClient(stack.connect.rest_url)
    for name in ("benchrouted", "benchraw"):  # left over by an interrupted run
        client.delete(name)
    drop_slots(cluster.conninfo("postgres"), ["slot_benchrouted", "slot_benchraw"])
    cluster.drop_database(DATABASE)
    cluster.ensure_database(DATABASE)
    engine = sa.create_engine(cluster.url(DATABASE))
    with engine.begin() as connection:
        outbox_migrations.upgrade(connection)
        outbox_migrations.create_cdc_role(connection, CDC_ROLE, stack.cdc_password())
    engine.dispose()
    conninfo = cluster.conninfo(DATABASE)
    outbox_settings = OutboxSettings()

    def connector(name: str) -> ConnectorSettings:
        return ConnectorSettings(
            url=stack.connect.rest_url,
            name=name,
            database_port=cluster.port,
            database_name=DATABASE,
            database_user=CDC_ROLE,
            slot_name=f"slot_{name}",
            topic_prefix=name,
        )

    routed = connector("benchrouted")
    routed_config = render_connector_config(routed, outbox_settings)
    raw = connector("benchraw")
    raw_config = {
        key: value
        for key, value in render_connector_config(raw, outbox_settings).items()
        if not key.startswith("transforms")
    }
    raw_config["value.converter"] = "org.apache.kafka.connect.json.JsonConverter"
    raw_config["value.converter.schemas.enable"] = "false"

    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores; Debezium 3.0.7 in Kafka "
        f"Connect 3.9 -> Tansu 0.6 on loopback; {arguments.events:,} events in one transaction"
    )
    if not arguments.latency_only:
        routed_type = f"thr{uuid.uuid4().hex[:8]}"
        with_router = measure_throughput(
            stack,
            conninfo,
            routed,
            routed_config,
            topic_for(routed_type),
            routed_type,
            arguments.events,
        )
        without_router = measure_throughput(
            stack,
            conninfo,
            raw,
            raw_config,
            f"{raw.topic_prefix}.outbox.outbox",
            f"raw{uuid.uuid4().hex[:8]}",
            arguments.events,
        )
        print(f"with the Outbox Event Router : {with_router:>9,.0f} events/s")
        print(f"raw change events            : {without_router:>9,.0f} events/s")
        print(
            f"ratio (router / raw)         : {with_router / without_router:>9.2f}   target >= 0.9"
        )
        results.figures.update(
            events=arguments.events,
            router_events_per_second=round(with_router, 1),
            raw_events_per_second=round(without_router, 1),
            ratio=round(with_router / without_router, 3),
        )
        figures["events/s, Event Router"] = with_router
        figures["events/s, raw change events"] = without_router
    latencies = measure_latency(stack, conninfo, routed, routed_config, arguments.seconds)
    print(
        f"commit-to-broker latency at 1,000 events/s over {arguments.seconds:.0f} s "
        f"({len(latencies):,} events): p50 {percentile(latencies, 0.5) * 1000:.0f} ms, "
        f"p95 {percentile(latencies, 0.95) * 1000:.0f} ms, "
        f"p99 {percentile(latencies, 0.99) * 1000:.0f} ms   target p99 < 1000 ms"
    )
    results.figures["commit_to_broker_seconds_at_1000"] = {
        name: round(percentile(latencies, fraction), 3)
        for name, fraction in (("p50", 0.5), ("p95", 0.95), ("p99", 0.99))
    }
    for share in (0.5, 0.99):
        figures[f"latency ms, p{share * 100:.0f}"] = percentile(latencies, share) * 1000
    drop_slots(cluster.conninfo("postgres"), [routed.slot_name, raw.slot_name])
    return figures


if __name__ == "__main__":
    main()
