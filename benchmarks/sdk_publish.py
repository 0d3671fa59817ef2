"""Cost of the outbox on a business transaction, on the private Postgres (fsync on).

Measures transactions per second of one business transaction (insert one order row):
alone, with one outbox event, and with ten events; at 1 and 4 concurrent clients (one
process and one connection each). The ways of writing the events:

- ``publish``: ``Outbox.publish`` / ``publish_many`` after the order's INSERT, psycopg in its
  default mode. Each statement waits for its answer: the events cost one more round trip.
- ``hand-written INSERT``: the peer a user would otherwise write: an INSERT of the same row
  (``json.dumps`` of the payload) into a Debezium-style outbox table (id, aggregatetype,
  aggregateid, type, payload; no trigger, no position) in the same transaction;
  ``executemany`` for ten events.
- ``publish, no trigger``: ``publish`` into a copy of the outbox table whose position comes
  from a column default instead of the trigger (no per-aggregate lock, no xid): what the
  trigger costs. Not a way to run: it drops the ordering guarantee.
- ``execute``: ``Outbox.execute`` runs the order's INSERT with the events attached (a
  data-modifying CTE): one statement, one round trip, default mode.
- ``publish, pipeline``: ``publish`` on a connection in pipeline mode (the plain transaction
  is pipelined too). ``publish`` does not wait, so the events travel with the COMMIT.

Scenarios are interleaved in rounds so that drift of the machine hits them all alike; the
median of the rounds is shown, with the ratios the targets are about.

    python -m benchmarks.sdk_publish                    # about 8 minutes
    python -m benchmarks.sdk_publish --seconds 1 --rounds 1 --clients 1   # smoke
"""

from __future__ import annotations

import argparse
import json
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
from benchmarks._results import Results
from outbox import Event, Outbox, OutboxSettings
from stack import PostgresCluster

DATABASE = "outbox_bench"
INSERT_ORDER = "INSERT INTO bench_orders (customer, total) VALUES (%s, %s)"
# Debezium's documented outbox table, written by hand.
INSERT_BY_HAND = (
    "INSERT INTO bench_debezium_outbox (id, aggregatetype, aggregateid, type, payload) "
    "VALUES (%s, %s, %s, %s, %s)"
)
NO_TRIGGER_SCHEMA = "bench_notrigger"
PLAIN, PUBLISH, BY_HAND, NO_TRIGGER, EXECUTE, PIPELINE = (
    "plain",
    "publish",
    "hand-written INSERT",
    "publish, no trigger",
    "execute",
    "publish, pipeline",
)
Body = Callable[[psycopg.Connection, int], None]


@dataclass(frozen=True)
class Scenario:
    style: str  # one of the styles above; PLAIN and PIPELINE with 0 events: the plain tx
    events: int  # 0: the plain transaction

    @property
    def pipeline(self) -> bool:
        return self.style == PIPELINE

    @property
    def label(self) -> str:
        if self.events == 0:
            return "plain, pipeline" if self.pipeline else "plain"
        return f"{self.style}, {self.events} event{'s' if self.events > 1 else ''}"


def events_for(number: int, count: int) -> list[Event]:
    return [
        Event("order", str(number), "OrderLine", {"order": number, "line": line, "sku": "a-1"})
        for line in range(count)
    ]


def body_of(scenario: Scenario) -> Body:
    if scenario.events == 0:
        return lambda connection, number: connection.execute(INSERT_ORDER, ("c", number)) and None
    if scenario.style == BY_HAND:

        def by_hand(connection: psycopg.Connection, number: int) -> None:
            connection.execute(INSERT_ORDER, ("c", number))
            rows = [
                (e.event_id, e.aggregate_type, e.aggregate_id, e.event_type, json.dumps(e.payload))
                for e in events_for(number, scenario.events)
            ]
            if len(rows) == 1:
                connection.execute(INSERT_BY_HAND, rows[0])
            else:
                connection.cursor().executemany(INSERT_BY_HAND, rows)

        return by_hand
    outbox = (
        Outbox(OutboxSettings(schema_name=NO_TRIGGER_SCHEMA))
        if scenario.style == NO_TRIGGER
        else Outbox()
    )
    if scenario.style == EXECUTE:

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
        connection.exec_driver_sql(
            "CREATE TABLE bench_debezium_outbox (id uuid PRIMARY KEY, "
            "aggregatetype varchar(255) NOT NULL, aggregateid varchar(255) NOT NULL, "
            "type varchar(255) NOT NULL, payload jsonb)"
        )
        # The outbox without its trigger: same columns, indexes and defaults; positions from
        # a plain sequence default.
        connection.exec_driver_sql(f"CREATE SCHEMA {NO_TRIGGER_SCHEMA}")
        connection.exec_driver_sql(
            f"CREATE TABLE {NO_TRIGGER_SCHEMA}.outbox (LIKE outbox.outbox INCLUDING ALL)"
        )
        connection.exec_driver_sql(f"CREATE SEQUENCE {NO_TRIGGER_SCHEMA}.outbox_position_seq")
        connection.exec_driver_sql(
            f"ALTER TABLE {NO_TRIGGER_SCHEMA}.outbox ALTER COLUMN position "
            f"SET DEFAULT nextval('{NO_TRIGGER_SCHEMA}.outbox_position_seq')"
        )
    engine.dispose()
    return cluster.conninfo(DATABASE)


SCENARIOS = [
    Scenario(PLAIN, 0),
    Scenario(PUBLISH, 1),
    Scenario(BY_HAND, 1),
    Scenario(NO_TRIGGER, 1),
    Scenario(EXECUTE, 1),
    Scenario(PUBLISH, 10),
    Scenario(BY_HAND, 10),
    Scenario(NO_TRIGGER, 10),
    Scenario(EXECUTE, 10),
    Scenario(PIPELINE, 0),
    Scenario(PIPELINE, 1),
    Scenario(PIPELINE, 10),
]
# (name, numerator, denominator, target)
RATIOS = [
    ("publish / hand-written, 1 event", Scenario(PUBLISH, 1), Scenario(BY_HAND, 1), 0.95),
    ("publish / hand-written, 10 events", Scenario(PUBLISH, 10), Scenario(BY_HAND, 10), 0.95),
    ("publish / plain, 1 event", Scenario(PUBLISH, 1), Scenario(PLAIN, 0), None),
    ("publish / plain, 10 events", Scenario(PUBLISH, 10), Scenario(PLAIN, 0), None),
    ("hand-written / plain, 1 event", Scenario(BY_HAND, 1), Scenario(PLAIN, 0), None),
    ("hand-written / plain, 10 events", Scenario(BY_HAND, 10), Scenario(PLAIN, 0), None),
    ("publish / no trigger, 1 event", Scenario(PUBLISH, 1), Scenario(NO_TRIGGER, 1), None),
    ("publish / no trigger, 10 events", Scenario(PUBLISH, 10), Scenario(NO_TRIGGER, 10), None),
    ("execute / plain, 1 event", Scenario(EXECUTE, 1), Scenario(PLAIN, 0), None),
    ("execute / plain, 10 events", Scenario(EXECUTE, 10), Scenario(PLAIN, 0), None),
    (
        "publish, pipeline / plain, pipeline, 1 event",
        Scenario(PIPELINE, 1),
        Scenario(PIPELINE, 0),
        None,
    ),
    (
        "publish, pipeline / plain, pipeline, 10 events",
        Scenario(PIPELINE, 10),
        Scenario(PIPELINE, 0),
        None,
    ),
]

# The fastest documented way for one event (execute, or publish in pipeline mode), each
# against the plain transaction of its own mode.
FASTEST = ("fastest documented way / plain, 1 event", None, None, 0.90)


def main() -> None:
    parser = argparse.ArgumentParser(description="Outbox cost on a business transaction.")
    parser.add_argument("--seconds", type=float, default=1.5, help="per measurement")
    parser.add_argument("--rounds", type=int, default=7, help="interleaved repetitions")
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--json", help="also write the figures to this JSON file")
    arguments = parser.parse_args()
    results = Results("sdk_publish", arguments.json)

    cluster = PostgresCluster()
    conninfo = prepare(cluster)
    with psycopg.connect(conninfo) as connection:
        server = connection.execute("SHOW server_version").fetchone()
        fsync = connection.execute("SHOW fsync").fetchone()
    assert server is not None and fsync is not None
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, Python "
        f"{platform.python_version()}; PostgreSQL {server[0]} on loopback, fsync={fsync[0]}; "
        f"psycopg {psycopg.__version__}; load average {os.getloadavg()[0]:.1f}"
    )
    print(f"{arguments.rounds} rounds x {arguments.seconds:g} s per figure; median shown\n")
    results.figures.update(
        postgres=server[0], seconds=arguments.seconds, rounds=arguments.rounds, clients={}
    )
    for clients in arguments.clients:
        samples: dict[Scenario, list[float]] = {scenario: [] for scenario in SCENARIOS}
        for _ in range(arguments.rounds):
            for scenario in SCENARIOS:
                samples[scenario].append(measure(conninfo, scenario, clients, arguments.seconds))
        median = {scenario: statistics.median(values) for scenario, values in samples.items()}
        print(f"{clients} client{'s' if clients > 1 else ''}:")
        for scenario in SCENARIOS:
            print(f"  {scenario.label:<34} {median[scenario]:>9,.0f} tx/s")
        ratios = {}
        fastest = max(
            median[Scenario(EXECUTE, 1)] / median[Scenario(PLAIN, 0)],
            median[Scenario(PIPELINE, 1)] / median[Scenario(PIPELINE, 0)],
        )
        for name, numerator, denominator, target in [*RATIOS, FASTEST]:
            ratio = fastest if numerator is None else median[numerator] / median[denominator]
            ratios[name] = {"ratio": round(ratio, 3), "target": target}
            verdict = "" if target is None else f"   target >= {target:.2f}"
            if target is not None:
                verdict += "  met" if ratio >= target else "  MISSED"
            print(f"  {name:<46} {ratio:>5.2f}{verdict}")
        print()
        results.figures["clients"][str(clients)] = {
            "tx_per_second": {scenario.label: round(median[scenario], 1) for scenario in SCENARIOS},
            "samples": {
                scenario.label: [round(value, 1) for value in samples[scenario]]
                for scenario in SCENARIOS
            },
            "ratios": ratios,
        }
    cluster.drop_database(DATABASE)
    results.write()


if __name__ == "__main__":
    main()
