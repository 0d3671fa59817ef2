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
- ``INSERT into the outbox``: the same hand-written INSERT (``json.dumps`` of the payload) into
  the outbox table itself (its triggers, constraint and indexes): the database's work of
  ``publish`` without the SDK's Python. ``publish`` against it is what the SDK costs on the
  client; it against the Debezium-style table is what the outbox table costs on the server.
- ``publish, no trigger``: ``publish`` into a copy of the outbox table whose position comes
  from a column default instead of the triggers (no per-aggregate lock, no xid, no topic
  registry): what the triggers cost. Not a way to run: it drops the ordering guarantee.
- ``execute``: ``Outbox.execute`` runs the order's INSERT with the events attached (a
  data-modifying CTE): one statement, one round trip, default mode.
- ``publish, pipeline``: ``publish`` on a connection in pipeline mode (the plain transaction
  is pipelined too). ``publish`` does not wait, so the events travel with the COMMIT.

Scenarios are interleaved transaction by transaction: each client runs every scenario in
turn, one transaction each (the order rotates every cycle), so that the machine's drift (it
is shared: a commit's flush takes from 0.3 to several ms depending on the others' load) hits
them all alike. A scenario's rate in a round is the number of clients divided by the median
time of its transactions in that round; the median of the rounds is shown, with the ratios
the targets are about. With several clients, each runs the same mix at once.

    python -m benchmarks.sdk_publish                    # about 5 minutes
    python -m benchmarks.sdk_publish --seconds 12 --round-seconds 3 --clients 1   # smoke
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
from dataclasses import dataclass

import psycopg
import sqlalchemy as sa

import outbox_migrations
from benchmarks._results import Results
from outbox import Event, Outbox, OutboxSettings
from outbox_stack import PostgresCluster

DATABASE = "outbox_bench"
INSERT_ORDER = "INSERT INTO bench_orders (customer, total) VALUES (%s, %s)"
# Debezium's documented outbox table, written by hand.
INSERT_BY_HAND = (
    "INSERT INTO bench_debezium_outbox (id, aggregatetype, aggregateid, type, payload) "
    "VALUES (%s, %s, %s, %s, %s)"
)
# The same row written by hand into the outbox table itself (headers and traceparent: the
# defaults; position: the trigger).
INSERT_INTO_OUTBOX = (
    "INSERT INTO outbox.outbox (id, aggregatetype, aggregateid, type, payload) "
    "VALUES (%s, %s, %s, %s, %s)"
)
NO_TRIGGER_SCHEMA = "bench_notrigger"
PLAIN, PUBLISH, BY_HAND, INTO_OUTBOX, NO_TRIGGER, EXECUTE, PIPELINE = (
    "plain",
    "publish",
    "hand-written INSERT",
    "INSERT into the outbox",
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
    if scenario.style in (BY_HAND, INTO_OUTBOX):
        insert = INSERT_BY_HAND if scenario.style == BY_HAND else INSERT_INTO_OUTBOX

        def by_hand(connection: psycopg.Connection, number: int) -> None:
            connection.execute(INSERT_ORDER, ("c", number))
            rows = [
                (e.event_id, e.aggregate_type, e.aggregate_id, e.event_type, json.dumps(e.payload))
                for e in events_for(number, scenario.events)
            ]
            if len(rows) == 1:
                connection.execute(insert, rows[0])
            else:
                connection.cursor().executemany(insert, rows)

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
    seconds: float,
    round_seconds: float,
    start_at: float,
    offset: int,
    results: multiprocessing.Queue,  # type: ignore[type-arg]
) -> None:
    """Run every scenario in turn, one transaction each, for ``seconds``; send back, per
    round of ``round_seconds`` and per scenario, the seconds each transaction took."""
    bodies = [body_of(scenario) for scenario in SCENARIOS]
    spent: dict[tuple[int, int], list[float]] = {}
    with (
        psycopg.connect(conninfo) as plain,
        psycopg.connect(conninfo) as pipelined,
        pipelined.pipeline(),
    ):
        connections = [pipelined if s.pipeline else plain for s in SCENARIOS]
        for number in range(20):  # warm up: prepared statements, caches
            for body, connection in zip(bodies, connections, strict=True):
                with connection.transaction():
                    body(connection, offset + number)
        while time.time() < start_at:
            time.sleep(0.001)
        number = offset + 1000
        cycle = 0
        while (now := time.time()) < start_at + seconds:
            round_number = int((now - start_at) / round_seconds)
            # Rotate the order, so that no scenario always follows the same one.
            for index in range(len(SCENARIOS)):
                which = (index + cycle) % len(SCENARIOS)
                connection = connections[which]
                started = time.perf_counter()
                with connection.transaction():
                    bodies[which](connection, number)
                spent.setdefault((round_number, which), []).append(time.perf_counter() - started)
                number += 1
            cycle += 1
    results.put(spent)


def measure(
    conninfo: str, clients: int, seconds: float, round_seconds: float
) -> dict[Scenario, list[float]]:
    """Transactions per second of each scenario, one figure per round: ``clients`` divided
    by the median time of the scenario's transactions in that round (a closed loop; the
    median, because a flush stalled by another process's I/O would otherwise decide the
    figure of whichever scenario it fell on)."""
    with psycopg.connect(conninfo, autocommit=True) as connection:
        connection.execute("CHECKPOINT")
    results: multiprocessing.Queue = multiprocessing.Queue()  # type: ignore[type-arg]
    start_at = time.time() + 2.0
    processes = [
        multiprocessing.Process(
            target=client,
            args=(conninfo, seconds, round_seconds, start_at, n * 10_000_000, results),
        )
        for n in range(clients)
    ]
    for process in processes:
        process.start()
    merged: dict[tuple[int, int], list[float]] = {}
    for _ in processes:
        for key, took in results.get(timeout=seconds + 120).items():
            merged.setdefault(key, []).extend(took)
    for process in processes:
        process.join(timeout=30)
    rounds = sorted({round_number for round_number, _ in merged})
    return {
        scenario: [
            clients / statistics.median(merged[(r, which)])
            for r in rounds
            if len(merged.get((r, which), ())) >= 3
        ]
        for which, scenario in enumerate(SCENARIOS)
    }


def prepare(cluster: PostgresCluster) -> str:
    cluster.up()
    cluster.drop_database(DATABASE)
    cluster.ensure_database(DATABASE)
    engine = sa.create_engine(cluster.url(DATABASE))
    with engine.begin() as connection:
        outbox_migrations.upgrade(connection)
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
    Scenario(INTO_OUTBOX, 1),
    Scenario(NO_TRIGGER, 1),
    Scenario(EXECUTE, 1),
    Scenario(PUBLISH, 10),
    Scenario(BY_HAND, 10),
    Scenario(INTO_OUTBOX, 10),
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
    # Where publish's time goes: the SDK's Python (against the same INSERT by hand), the
    # outbox table (that INSERT against the Debezium-style one), the triggers (no trigger).
    (
        "publish / INSERT into the outbox, 1 event",
        Scenario(PUBLISH, 1),
        Scenario(INTO_OUTBOX, 1),
        None,
    ),
    (
        "publish / INSERT into the outbox, 10 events",
        Scenario(PUBLISH, 10),
        Scenario(INTO_OUTBOX, 10),
        None,
    ),
    (
        "INSERT into the outbox / hand-written, 1 event",
        Scenario(INTO_OUTBOX, 1),
        Scenario(BY_HAND, 1),
        None,
    ),
    (
        "INSERT into the outbox / hand-written, 10 events",
        Scenario(INTO_OUTBOX, 10),
        Scenario(BY_HAND, 10),
        None,
    ),
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
    parser.add_argument("--seconds", type=float, default=120.0, help="per client count")
    parser.add_argument("--round-seconds", type=float, default=4.0, help="one figure per round")
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
    print(
        f"every scenario in turn, one transaction each, for {arguments.seconds:g} s; "
        f"median of the {arguments.round_seconds:g}-second rounds shown\n"
    )
    results.figures.update(
        postgres=server[0],
        seconds=arguments.seconds,
        round_seconds=arguments.round_seconds,
        clients={},
    )
    for clients in arguments.clients:
        samples = measure(conninfo, clients, arguments.seconds, arguments.round_seconds)
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
