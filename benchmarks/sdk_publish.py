"""Cost of the outbox on a business transaction, on the private Postgres (fsync on).

Measures transactions per second of one business transaction (insert one order row):
alone, with one outbox event, and with ten events; at 1 and 4 concurrent clients (one
process and one connection each). Three ways of writing the events:

- ``publish``: ``Outbox.publish`` / ``publish_many`` after the order's INSERT, psycopg in its
  default mode. Each statement waits for its answer: the events cost one more round trip.
- ``publish, pipeline``: the same, on a connection in pipeline mode (the plain transaction
  is pipelined too). ``publish`` does not wait, so the events travel with the COMMIT.
- ``execute``: ``Outbox.execute`` runs the order's INSERT with the events attached (a
  data-modifying CTE): one statement, one round trip, default mode.

Scenarios are interleaved in rounds so that drift of the machine hits them all alike; the
median of the rounds is shown, with the ratio to the plain transaction of the same mode.

    python -m benchmarks.sdk_publish                    # about 4 minutes
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
from dataclasses import dataclass

import psycopg
import sqlalchemy as sa

import migrations
from outbox import Event, Outbox
from stack import PostgresCluster

DATABASE = "outbox_bench"
INSERT_ORDER = "INSERT INTO bench_orders (customer, total) VALUES (%s, %s)"
Body = Callable[[psycopg.Connection, int], None]


@dataclass(frozen=True)
class Scenario:
    style: str  # "publish", "publish, pipeline" or "execute"
    events: int  # 0: the plain transaction

    @property
    def pipeline(self) -> bool:
        return self.style == "publish, pipeline"


def events_for(number: int, count: int) -> list[Event]:
    return [
        Event("order", str(number), "OrderLine", {"order": number, "line": line, "sku": "a-1"})
        for line in range(count)
    ]


def body_of(scenario: Scenario) -> Body:
    outbox = Outbox()
    if scenario.events == 0:
        return lambda connection, number: connection.execute(INSERT_ORDER, ("c", number)) and None
    if scenario.style == "execute":

        def attached(connection: psycopg.Connection, number: int) -> None:
            outbox.execute(
                connection, INSERT_ORDER, ("c", number), events=events_for(number, scenario.events)
            )

        return attached

    def separate(connection: psycopg.Connection, number: int) -> None:
        connection.execute(INSERT_ORDER, ("c", number))
        outbox.publish_many(connection, events_for(number, scenario.events))

    return separate


def client(
    conninfo: str,
    scenario: Scenario,
    seconds: float,
    start_at: float,
    offset: int,
    results: multiprocessing.Queue,  # type: ignore[type-arg]
) -> None:
    body = body_of(scenario)
    done = 0
    with (
        psycopg.connect(conninfo) as connection,
        connection.pipeline() if scenario.pipeline else nullcontext(),
    ):
        for number in range(20):  # warm up: prepared statements, caches
            with connection.transaction():
                body(connection, offset + number)
        while time.time() < start_at:
            time.sleep(0.001)
        deadline = start_at + seconds
        number = offset + 1000
        while time.time() < deadline:
            with connection.transaction():
                body(connection, number)
            number += 1
            done += 1
    results.put(done)


def measure(conninfo: str, scenario: Scenario, clients: int, seconds: float) -> float:
    # Every measurement starts right after a checkpoint, so the full-page writes that follow
    # one fall on every scenario alike instead of on whichever runs when one happens.
    with psycopg.connect(conninfo, autocommit=True) as connection:
        connection.execute("CHECKPOINT")
    results: multiprocessing.Queue = multiprocessing.Queue()  # type: ignore[type-arg]
    start_at = time.time() + 1.0
    processes = [
        multiprocessing.Process(
            target=client, args=(conninfo, scenario, seconds, start_at, n * 10_000_000, results)
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


SCENARIOS = [
    Scenario("publish", 0),
    Scenario("publish", 1),
    Scenario("publish", 10),
    Scenario("execute", 1),
    Scenario("execute", 10),
    Scenario("publish, pipeline", 0),
    Scenario("publish, pipeline", 1),
    Scenario("publish, pipeline", 10),
]


def main() -> None:
    parser = argparse.ArgumentParser(description="Outbox cost on a business transaction.")
    parser.add_argument("--seconds", type=float, default=3.0, help="per measurement")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved repetitions")
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 4])
    arguments = parser.parse_args()

    cluster = PostgresCluster()
    conninfo = prepare(cluster)
    with psycopg.connect(conninfo) as connection:
        server = connection.execute("SHOW server_version").fetchone()
        fsync = connection.execute("SHOW fsync").fetchone()
    assert server is not None and fsync is not None
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, Python "
        f"{platform.python_version()}; PostgreSQL {server[0]} on loopback, fsync={fsync[0]}; "
        f"psycopg {psycopg.__version__}"
    )
    print(f"{arguments.rounds} rounds x {arguments.seconds:.0f} s per figure; median shown\n")
    header = (
        f"{'clients':>7}  {'style':<18} {'plain tx/s':>10} {'+1 event':>9} {'ratio':>6} "
        f"{'+10 events':>11} {'ratio':>6}"
    )
    print(header)
    print("-" * len(header))
    for clients in arguments.clients:
        samples: dict[Scenario, list[float]] = {scenario: [] for scenario in SCENARIOS}
        for _ in range(arguments.rounds):
            for scenario in SCENARIOS:
                samples[scenario].append(measure(conninfo, scenario, clients, arguments.seconds))
        median = {scenario: statistics.median(values) for scenario, values in samples.items()}
        for style, plain_style in (
            ("publish", "publish"),
            ("execute", "publish"),
            ("publish, pipeline", "publish, pipeline"),
        ):
            plain = median[Scenario(plain_style, 0)]
            one, ten = median[Scenario(style, 1)], median[Scenario(style, 10)]
            print(
                f"{clients:>7}  {style:<18} {plain:>10,.0f} {one:>9,.0f} {one / plain:>6.2f} "
                f"{ten:>11,.0f} {ten / plain:>6.2f}"
            )
    print("\ntargets: one event >= 0.90x plain; ten events >= 0.80x plain")
    cluster.drop_database(DATABASE)


if __name__ == "__main__":
    main()
