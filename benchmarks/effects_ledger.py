"""Cost of the side-effect ledger per call, on a private Postgres (fsync on), one client.

Each step is two short transactions (started; then lock, call, done): two commits. Shown:
a one-row insert and commit (the disk's pace), steps per second with a call that does
nothing (the ledger alone), a bare HTTP call to the
local payment provider (examples/outbox_examples/payment_provider.py), and the same call through the
ledger, with the ratio to the bare call. Also the cost of skipping a done step (a redelivery).

    python -m benchmarks.effects_ledger                 # about 30 seconds
    python -m benchmarks.effects_ledger --steps 200
"""

from __future__ import annotations

import argparse
import platform
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import sqlalchemy as sa

import outbox_migrations
from benchmarks._results import Results
from benchmarks._shared import free_port
from outbox import Effects
from outbox.effects import EffectStep
from outbox_examples.payment_effects import ProviderClient
from outbox_examples.payment_provider import PaymentProvider
from outbox_stack import PostgresCluster, StackSettings

DATABASE = "outbox_bench_effects"


def rate(steps: int, work: Callable[[int], object]) -> float:
    started = time.perf_counter()
    for number in range(steps):
        work(number)
    return steps / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description="Cost of the side-effect ledger per call.")
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--json", help="also write the figures to this JSON file")
    arguments = parser.parse_args()
    steps = arguments.steps
    results = Results("effects_ledger", arguments.json)
    cluster = PostgresCluster(
        StackSettings(dir=Path(".stack") / "bench-effects", postgres_port=free_port())
    )
    cluster.down()
    cluster.up()
    provider = PaymentProvider().start()
    try:
        cluster.ensure_database(DATABASE)
        engine = sa.create_engine(cluster.url(DATABASE), pool_size=2)
        with engine.begin() as connection:
            outbox_migrations.upgrade(connection)
        ledger = Effects(consumer=f"bench-{uuid.uuid4().hex[:6]}", begin=engine.begin)
        client = ProviderClient(provider.url)
        events = [str(uuid.uuid4()) for _ in range(steps)]

        def nothing(step: EffectStep) -> str:
            return "ref"

        def bare_http(number: int) -> str:
            key = uuid.uuid5(uuid.NAMESPACE_URL, f"bare-{number}")
            return client.charge(EffectStep("bench", "-", "bare", key, 1, {"amount": "1.00"}))

        with engine.begin() as connection:
            connection.exec_driver_sql("CREATE TABLE IF NOT EXISTS bench_commits (id uuid)")

        def one_commit(_number: int) -> None:
            with engine.begin() as connection:
                connection.execute(
                    sa.text("INSERT INTO bench_commits VALUES (:id)"), {"id": uuid.uuid4()}
                )

        commit = rate(steps, one_commit)
        alone = rate(steps, lambda n: ledger.perform(events[n], "noop", nothing))
        skip = rate(steps, lambda n: ledger.perform(events[n], "noop", nothing))
        http = rate(steps, bare_http)
        through = rate(
            steps, lambda n: ledger.perform(events[n], "charge", client.charge, context={})
        )
        print(
            f"machine: {platform.machine()}, Python {platform.python_version()}; PostgreSQL "
            f"on loopback, fsync on; {steps} steps each, one client\n"
            f"one-row insert, commit    {commit:>8,.0f} tx/s     ({1000 / commit:.2f} ms/tx)\n"
            f"ledger, no-op call        {alone:>8,.0f} steps/s  ({1000 / alone:.2f} ms/step,"
            f" {commit / alone:.1f} commits' time)\n"
            f"redelivery of a done step {skip:>8,.0f} steps/s  ({1000 / skip:.2f} ms/step)\n"
            f"bare HTTP call            {http:>8,.0f} calls/s  ({1000 / http:.2f} ms/call)\n"
            f"HTTP call through ledger  {through:>8,.0f} calls/s  ({1000 / through:.2f} ms/call,"
            f" {through / http:.2f}x the bare call)"
        )
        results.figures.update(
            steps=steps,
            commits_per_second=round(commit, 1),
            ledger_noop_steps_per_second=round(alone, 1),
            redelivered_done_steps_per_second=round(skip, 1),
            bare_http_calls_per_second=round(http, 1),
            http_through_ledger_calls_per_second=round(through, 1),
            through_over_bare=round(through / http, 3),
        )
        engine.dispose()
    finally:
        provider.stop()
        cluster.down()
    results.write()


if __name__ == "__main__":
    main()
