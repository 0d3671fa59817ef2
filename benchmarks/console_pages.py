"""How long the console's pages take, with the stack under load.

Starts ``outbox console`` (a process, as ops run it) against the running default stack
(``outbox stack up``: its PostgreSQL and broker are started if they are not running; Kafka
Connect is read if it runs) while a writer commits events at a steady rate into a database
of its own and a polling relay (in this process, its health endpoint on a free port) publishes
them; one event too large for the relay makes a dead letter. Then asks each page in turn,
``--requests`` times, and prints each page's p50 and p95: the server's own time (its
``Server-Timing`` header: the time the console spent on the request) and the time a client
on loopback waited.

    python -m benchmarks.console_pages                       # about 2 minutes
    python -m benchmarks.console_pages --rate 2000 --requests 100

The overview reads what each panel's thread last read (it never waits on a component); an
event's lineage runs ``outbox trace`` in two steps (the outbox and the lake, then Kafka
searched), each measured, fewer times than the pages: for the event first written (delivered,
its row deleted, no lake here: nothing to read on Kafka) and for the dead letter (its
aggregate's partition read from an hour before it was built to its end: every record written).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from pathlib import Path

import psycopg

from benchmarks._shared import (
    free_port,
    fresh_database,
    paced_writes,
    percentile,
    postgres_and_broker,
)
from outbox import Event, Outbox, OutboxSettings
from outbox_relay.health import HealthServer
from outbox_relay.service import Relay
from outbox_relay.settings import RelaySettings

DATABASE = "outbox_bench_console"


def ask(url: str) -> tuple[float, float, int]:
    """One request: the server's time (ms, from Server-Timing), the client's (ms), status."""
    started = time.perf_counter()
    with urllib.request.urlopen(url, timeout=60) as answer:
        answer.read()
        timing = answer.headers.get("Server-Timing", "app;dur=nan")
        status = answer.status
    waited = (time.perf_counter() - started) * 1000
    return float(timing.split("dur=", 1)[1]), waited, status


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=int, default=1000, help="Events per second written.")
    parser.add_argument("--requests", type=int, default=200, help="Requests per page.")
    args = parser.parse_args()

    stack = postgres_and_broker()
    url = fresh_database(stack, DATABASE)
    conninfo = stack.postgres.conninfo(DATABASE)
    aggregate_type = f"console{uuid.uuid4().hex[:6]}"
    relay_port = free_port()
    relay = Relay(
        RelaySettings(mode="polling", max_request_bytes=4096, http_port=relay_port),
        database_url=url,
        kafka=stack.kafka,
        tables=OutboxSettings().tables,
    )
    health = HealthServer("127.0.0.1", relay_port, relay.liveness, relay.metrics)
    health.start()
    stop = threading.Event()
    relay_thread = threading.Thread(target=relay.run, args=(stop,), daemon=True)
    relay_thread.start()
    huge = Event(aggregate_type, "huge", "Tick", {"blob": "x" * 20_000})
    with psycopg.connect(conninfo) as connection, connection.transaction():
        Outbox().publish_many(connection, [huge])

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = Path(stack.settings.root) / "console-bench.log"
    env = {
        **os.environ,
        **stack.environment(),
        "OUTBOX_DATABASE_URL": url,
        "OUTBOX_CONSOLE_PORT": str(port),
        "OUTBOX_CONSOLE_RELAY_URLS": f"http://127.0.0.1:{relay_port}",
    }
    with log.open("ab") as out:
        console = subprocess.Popen(
            [sys.executable, "-m", "outbox_cli.main", "console"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    committed: dict[uuid.UUID, float] = {}
    seconds = 90 + args.requests * 0.5  # the writer outlasts the requests (and the lineages)
    writer = threading.Thread(
        target=paced_writes,
        args=(conninfo, aggregate_type, committed),
        kwargs={"events_per_tick": max(1, args.rate // 100), "seconds": seconds},
        daemon=True,
    )
    try:
        deadline = time.monotonic() + 60
        while True:  # the console answers, and every panel has been read once
            try:
                if (
                    b"reading..."
                    not in urllib.request.urlopen(f"{base}/fragments/overview", timeout=5).read()
                ):
                    break
            except OSError:
                pass
            if time.monotonic() > deadline or console.poll() is not None:
                raise SystemExit(f"the console did not start; see {log}")
            time.sleep(0.2)
        writer.start()
        deadline = time.monotonic() + 60
        while relay.metrics.registry.get_sample_value("outbox_relay_dead_lettered_total") != 1:
            if time.monotonic() > deadline:
                raise SystemExit("no dead letter within 60 s: is the relay publishing?")
            time.sleep(0.2)
        time.sleep(5)  # the load under way before the first request
        event_id = next(iter(committed))
        pages = {
            "overview /": "/",
            "overview fragment": "/fragments/overview",
            "event page": f"/events?id={event_id}",
            "dead letters": "/dead-letters",
            "one dead letter": f"/dead-letters/relay/{huge.event_id}",
            "lineage 1: outbox, lake": f"/fragments/lineage?id={event_id}",
            "lineage 2: Kafka searched": f"/fragments/lineage?id={event_id}&kafka=1",
            "dead letter's lineage 1": f"/fragments/lineage?id={huge.event_id}",
            "dead letter's lineage 2": f"/fragments/lineage?id={huge.event_id}&kafka=1",
        }
        print(
            f"console pages, {args.requests} requests each, while {args.rate:,} events/s are "
            "written and a polling relay publishes them (ms)"
        )
        print(
            f"{'page':<26} {'server p50':>10} {'server p95':>10} {'client p50':>10} "
            f"{'client p95':>10}"
        )
        for name, path in pages.items():
            count = args.requests if "lineage" not in name else max(5, args.requests // 20)
            server, client = [], []
            for _ in range(count):
                took, waited, status = ask(base + path)
                assert status == 200, (path, status)
                server.append(took)
                client.append(waited)
                time.sleep(0.05)  # a person's pace, not a load test of the console
            server.sort()
            client.sort()
            print(
                f"{name:<26} {percentile(server, 0.5):>10.1f} {percentile(server, 0.95):>10.1f} "
                f"{percentile(client, 0.5):>10.1f} {percentile(client, 0.95):>10.1f}"
            )
        print(
            "lineage 1, 2: the two steps of an event's lineage (`outbox trace`), the second "
            "with Kafka searched. A delivered event here has no row and no lake row: its "
            "partition is unknown, nothing is read. The dead letter's aggregate partition is "
            "read from an hour before it was built to its end: every record of the run."
        )
        print(f"events committed meanwhile: {len(committed):,}; console log: {log}")
    finally:
        console.terminate()
        console.wait(timeout=30)
        stop.set()
        relay_thread.join(timeout=60)
        health.stop()
        writer.join(timeout=seconds + 30)
        stack.postgres.drop_database(DATABASE)


if __name__ == "__main__":
    main()
