"""Cost of the outbox on a business transaction, on the private Postgres (fsync on).

Measures transactions per second of one business transaction (insert one order row):
alone, with one outbox event (``publish``), and with ten events (``publish_many``); at 1 and
4 concurrent clients (one process and one connection each). Two client modes, each used
for the plain transaction and the ones with events alike:

- ``default``: psycopg as most code uses it; every statement waits for its answer, so an
  event costs one more round trip.
- ``pipeline``: the connection stays in pipeline mode (``with conn.pipeline():``); the
  SDK's ``publish`` does not wait for its answer, so BEGIN, the order, the events and COMMIT
  travel together and the event adds no round trip.

Scenarios are interleaved in rounds so that drift of the machine hits them all alike; the
median of the rounds is shown. Prints the figures and the ratios to the plain transaction.

    python -m benchmarks.sdk_publish               # about 2 minutes
    python -m benchmarks.sdk_publish --seconds 2 --rounds 1
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import platform
import statistics
import time
from collections.abc import Callable
from contextlib import nullcontext

import psycopg
import sqlalchemy as sa

import migrations
from outbox import Event, Outbox
from stack import PostgresCluster

SCENARIOS = ("plain", "one event", "ten events")
DATABASE = "outbox_bench"


def transaction_body(scenario: str, outbox: Outbox) -> Callable[[psycopg.Connection, int], None]:
    def body(connection: psycopg.Connection, number: int) -> None:
        connection.execute(
            "INSERT INTO bench_orders (customer, total) VALUES (%s, %s)", ("c", number)
        )
        aggregate = str(number)
        if scenario == "one event":
            outbox.publish(connection, Event("order", aggregate, "OrderPlaced", {"n": number}))
        elif scenario == "ten events":
            outbox.publish_many(
                connection,
                [
                    Event("order", aggregate, "OrderLine", {"n": number, "line": i})
                    for i in range(10)
                ],
            )

    return body


def client(
    conninfo: str,
    scenario: str,
    pipeline: bool,
    seconds: float,
    start_at: float,
    offset: int,
    results: multiprocessing.Queue,
) -> None:  # type: ignore[type-arg]
    outbox = Outbox()
    body = transaction_body(scenario, outbox)
    done = 0
    with psycopg.connect(conninfo) as connection:
        # Warm up: prepared statements, caches.
        for number in range(20):
            with connection.transaction():
                body(connection, offset + number)
        while time.time() < start_at:
            time.sleep(0.001)
        deadline = start_at + seconds
        number = offset + 1000
        with connection.pipeline() if pipeline else nullcontext():
            while time.time() < deadline:
                with connection.transaction():
                    body(connection, number)
                number += 1
                done += 1
    results.put(done)


def measure(conninfo: str, scenario: str, clients: int, pipeline: bool, seconds: float) -> float:
    results: multiprocessing.Queue = multiprocessing.Queue()  # type: ignore[type-arg]
    start_at = time.time() + 1.0
    processes = [
        multiprocessing.Process(
            target=client,
            args=(conninfo, scenario, pipeline, seconds, start_at, n * 10_000_000, results),
        )
        for n in range(clients)
    ]
    for process in processes:
        process.start()
    total = sum(results.get(timeout=seconds + 60) for _ in processes)
    for process in processes:
        process.join(timeout=30)
    return total / seconds


def prepare(cluster: PostgresCluster) -> str:
    cluster.up()
    cluster.drop_database(DATABASE)
    cluster.ensure_database(DATABASE)
    engine = sa.create_engine(cluster.url(DATABASE))
    with engine.begin() as connection:
        migrations.upgrade(connection)
        connection.exec_driver_sql(
            "CREATE TABLE bench_orders (id bigserial PRIMARY KEY, customer text NOT NULL, "
            "total numeric(12, 2) NOT NULL, created_at timestamptz NOT NULL DEFAULT now())"
        )
    engine.dispose()
    return cluster.conninfo(DATABASE)


def main() -> None:
    parser = argparse.ArgumentParser(description="Outbox cost on a business transaction.")
    parser.add_argument("--seconds", type=float, default=4.0, help="per measurement")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved repetitions")
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 4])
    arguments = parser.parse_args()

    cluster = PostgresCluster()
    conninfo = prepare(cluster)
    with psycopg.connect(conninfo) as connection:
        server = connection.execute("SHOW server_version").fetchone()
        fsync = connection.execute("SHOW fsync").fetchone()
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores; PostgreSQL {server[0]} "  # type: ignore[index]
        f"on loopback, fsync={fsync[0]}; psycopg {psycopg.__version__}"  # type: ignore[index]
    )
    print(f"{arguments.rounds} rounds x {arguments.seconds:.0f} s per figure; median shown\n")
    rows = []
    for pipeline in (False, True):
        for clients in arguments.clients:
            samples: dict[str, list[float]] = {scenario: [] for scenario in SCENARIOS}
            for _ in range(arguments.rounds):
                for scenario in SCENARIOS:
                    samples[scenario].append(
                        measure(conninfo, scenario, clients, pipeline, arguments.seconds)
                    )
            medians = {scenario: statistics.median(values) for scenario, values in samples.items()}
            rows.append((pipeline, clients, medians))
    header = (
        f"{'mode':<9} {'clients':>7} {'plain tx/s':>11} {'+1 event':>9} {'ratio':>6} "
        f"{'+10 events':>11} {'ratio':>6}"
    )
    print(header)
    print("-" * len(header))
    for pipeline, clients, medians in rows:
        plain = medians["plain"]
        print(
            f"{'pipeline' if pipeline else 'default':<9} {clients:>7} {plain:>11,.0f} "
            f"{medians['one event']:>9,.0f} {medians['one event'] / plain:>6.2f} "
            f"{medians['ten events']:>11,.0f} {medians['ten events'] / plain:>6.2f}"
        )
    print("\ntargets: one event >= 0.90x plain; ten events >= 0.80x plain")
    cluster.drop_database(DATABASE)


if __name__ == "__main__":
    main()
