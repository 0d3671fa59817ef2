"""Relays side by side: the outbox's slices shared, one relay killed, one added, one upgraded.

Real relay processes (`outbox relay run`) on the suite's PostgreSQL and broker. Every event
must arrive, none that was never written, and each aggregate's first arrivals in commit
order, whichever relay sent them (relay/outbox_relay/slices.py).
"""

from __future__ import annotations

import json
import signal
import threading
import time
import uuid
from collections import Counter, defaultdict
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa

import outbox_migrations
from outbox import Event, Outbox
from outbox.core.contract import event_id_of, topic_for
from outbox_relay.slices import SLICES
from tests.fix_relay import RelayBench, RelayProcess, sample, wait_until
from tests.kafka_read import read_until

pytestmark = pytest.mark.timeout(420)

AGGREGATES = 60
BATCH = 300


def holding(relays: list[RelayProcess]) -> list[int]:
    return [int(relay.metric("outbox_relay_slices")) for relay in relays]


def lease_holders(bench: RelayBench) -> dict[str, int]:
    """Live holders of slices, by how many they hold, read from the lease table."""
    with bench.database.connect() as connection:
        rows = connection.execute(
            "SELECT holder::text, count(*) FROM outbox.outbox_relay_lease "
            "WHERE name LIKE 'slice %' AND expires_at > clock_timestamp() GROUP BY holder"
        ).fetchall()
    return {holder: int(count) for holder, count in rows}


class Writers:
    """Four writers, each the only one of its aggregates (its commit order is theirs,
    numbered by ``n``), paced so that the load lasts while relays come and go."""

    def __init__(self, bench: RelayBench, aggregate_type: str, commits: int) -> None:
        self.bench = bench
        self.aggregate_type = aggregate_type
        self.commits = commits
        self.counters = [0] * AGGREGATES
        self.done = [0] * 4
        self.errors: list[BaseException] = []
        self.threads = [threading.Thread(target=self._run, args=(n,)) for n in range(4)]

    def _run(self, number: int) -> None:
        owned = [a for a in range(AGGREGATES) if a % 4 == number]
        try:
            with self.bench.database.connect() as connection:
                for commit in range(self.commits):
                    events = []
                    for k in range(10):
                        aggregate = owned[(commit * 10 + k) % len(owned)]
                        n = self.counters[aggregate]
                        self.counters[aggregate] += 1
                        events.append(Event(self.aggregate_type, str(aggregate), "Tick", {"n": n}))
                    with connection.transaction():
                        Outbox().publish_many(connection, events)
                    self.done[number] += 1
                    time.sleep(0.004)  # a steady load over the test, not a condition to await
        except BaseException as error:
            self.errors.append(error)

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    def join(self) -> int:
        for thread in self.threads:
            thread.join(timeout=240)
        assert not any(t.is_alive() for t in self.threads), "a writer did not finish"
        assert not self.errors, self.errors
        return sum(self.counters)


def check_order(records: list[Any], expected: int) -> int:
    """Every event once at least, each aggregate's first arrivals numbered 0, 1, 2, ...;
    returns how many copies arrived beyond the first."""
    seen: set[uuid.UUID] = set()
    by_aggregate: dict[bytes, list[int]] = defaultdict(list)
    for record in records:
        event_id = event_id_of(record.headers)
        if event_id not in seen:
            seen.add(event_id)
            by_aggregate[record.key].append(json.loads(record.value)["n"])
    assert len(seen) == expected, f"{expected - len(seen)} events missing"
    for key, numbers in by_aggregate.items():
        assert numbers == list(range(len(numbers))), f"aggregate {key!r} out of order"
    return len(records) - len(seen)


def test_three_relays_share_the_work_lose_one_gain_one_and_keep_every_order(
    relay_bench: RelayBench,
) -> None:
    """Three relays split the slices and each publishes; one is ``kill -9``ed under load and
    the two others hold every slice within seconds; a fourth joins and gets its share; every
    event arrives, each aggregate in commit order."""
    aggregate_type = f"s{uuid.uuid4().hex[:10]}"
    relays = [relay_bench.process(OUTBOX_RELAY_BATCH_SIZE=str(BATCH)) for _ in range(3)]
    wait_until(
        lambda: sorted(holding(relays)) == [10, 11, 11],
        timeout=60,
        what=f"three relays share the {SLICES} slices",
    )
    writers = Writers(relay_bench, aggregate_type, commits=700)
    writers.start()
    wait_until(
        lambda: all(r.metric("outbox_relay_published_total") > 0 for r in relays),
        timeout=60,
        what="every relay publishes",
    )
    victim, *survivors = relays
    victim.kill()
    killed_at = time.monotonic()
    wait_until(
        lambda: sum(holding(survivors)) == SLICES, timeout=20, what="the survivors take over"
    )
    failover = time.monotonic() - killed_at
    assert sorted(holding(survivors)) == [16, 16]
    newcomer = relay_bench.process(OUTBOX_RELAY_BATCH_SIZE=str(BATCH))
    relays = [*survivors, newcomer]
    wait_until(
        lambda: sorted(holding(relays)) == [10, 11, 11],
        timeout=30,
        what="the new relay gets its share",
    )
    assert sorted(lease_holders(relay_bench).values()) == [10, 11, 11]
    assert writers.threads[0].is_alive(), "the load ended before the new relay joined"
    wait_until(
        lambda: newcomer.metric("outbox_relay_published_total") > 0,
        timeout=30,
        what="the new relay publishes",
    )
    total = writers.join()
    wait_until(lambda: relay_bench.undelivered() == 0, timeout=120, what="outbox drained")
    records = read_until(
        relay_bench.kafka.bootstrap_servers,
        topic_for(aggregate_type),
        lambda r: len({event_id_of(record.headers) for record in r}) >= total,
        timeout=90,
    )
    copies = check_order(records, total)
    print(f"{total} events, failover {failover:.2f} s, {copies} copies")
    # Copies come only from the killed relay: batches it sent but had not deleted yet.
    assert copies <= 2 * BATCH, f"{copies} copies"
    assert failover < 10, f"the killed relay's slices were taken after {failover:.1f} s"
    for relay in relays:
        assert relay.terminate() == 0
    assert lease_holders(relay_bench) == {}, "a clean stop hands every slice back"


def test_each_aggregate_is_sent_by_one_relay_only(relay_bench: RelayBench) -> None:
    """Two relays, no fault: both publish, together every event exactly once, each
    aggregate's in order (one relay per slice: nobody sends another's aggregate)."""
    aggregate_type = f"s{uuid.uuid4().hex[:10]}"
    relays = [relay_bench.process(OUTBOX_RELAY_BATCH_SIZE=str(BATCH)) for _ in range(2)]
    wait_until(lambda: holding(relays) == [16, 16], timeout=60, what="two relays share")
    with relay_bench.database.connect() as connection:
        for aggregate in range(AGGREGATES):
            with connection.transaction():
                Outbox().publish_many(
                    connection,
                    [Event(aggregate_type, str(aggregate), "Tick", {"n": n}) for n in range(5)],
                )
        slice_of = dict(
            connection.execute(
                "SELECT aggregateid, hashtextextended(aggregatetype || ':' || aggregateid, 0) "
                f"& {SLICES - 1} FROM outbox.outbox WHERE aggregatetype = %s",
                (aggregate_type,),
            ).fetchall()
        )
    wait_until(lambda: relay_bench.undelivered() == 0, timeout=60, what="outbox drained")
    assert len(set(slice_of.values())) > 16, "the aggregates fall into many slices"
    published = [relay.metric("outbox_relay_published_total") for relay in relays]
    assert all(count > 0 for count in published), published
    assert sum(published) == AGGREGATES * 5
    records = read_until(
        relay_bench.kafka.bootstrap_servers,
        topic_for(aggregate_type),
        lambda r: len(r) >= AGGREGATES * 5,
        timeout=60,
    )
    assert check_order(records, AGGREGATES * 5) == 0
    per_key = Counter(record.key for record in records)
    assert set(per_key.values()) == {5}
    for relay in relays:
        assert relay.terminate() == 0


def test_no_slice_is_taken_while_a_relay_of_the_earlier_version_leads(
    relay_bench: RelayBench,
) -> None:
    """A rolling upgrade: the ``leader`` row of a relay before outbox_0011, its session
    alive, keeps the new relays from sending; once it ends they take every slice."""
    engine = sa.create_engine(relay_bench.database.url)
    with engine.begin() as connection:
        outbox_migrations.downgrade(connection, "outbox_0010")
    old = psycopg.connect(relay_bench.database.conninfo, autocommit=True)
    try:
        old.execute("SELECT pg_advisory_lock(4242)")
        old.execute(
            "INSERT INTO outbox.outbox_relay_lease VALUES "
            "('leader', gen_random_uuid(), pg_backend_pid(), 4242, 1, 'infinity')"
        )
        with engine.begin() as connection:
            outbox_migrations.upgrade(connection)
        with pytest.raises(psycopg.errors.CheckViolation):
            old.execute(
                "UPDATE outbox.outbox_relay_lease SET expires_at = 'infinity' WHERE name = 'leader'"
            )
        aggregate_type = f"s{uuid.uuid4().hex[:10]}"
        with relay_bench.database.connect() as connection, connection.transaction():
            Outbox().publish(connection, Event(aggregate_type, "1", "Tick", {}))
        relay = relay_bench.process()
        wait_until(lambda: relay.probe("/readyz") == 200, timeout=60, what="the relay is up")
        for _ in range(4):  # four balance rounds of 0.5 s (ready: it has tried once)
            assert relay.metric("outbox_relay_slices") == 0
            time.sleep(0.5)  # an absence over time, not a condition to await
        assert relay_bench.undelivered() == 1
    finally:
        old.close()  # the old relay's session ends: its lease with it
        engine.dispose()
    wait_until(lambda: relay_bench.undelivered() == 0, timeout=30, what="the new relay leads")
    assert relay.metric("outbox_relay_slices") == SLICES
    assert relay.terminate() == 0


def test_a_send_longer_than_the_lease_keeps_the_slices_and_sends_each_event_once(
    relay_bench: RelayBench,
) -> None:
    """The broker frozen for three leases while a batch is in flight: the relay renews its
    leases while it waits for the broker, so it neither loses its slices nor sends the
    batch again once the broker answers."""
    aggregate_type = f"s{uuid.uuid4().hex[:10]}"
    broker = relay_bench.kafka.broker.process
    with relay_bench.in_thread(lease_seconds=2.0, batch_size=500) as relay:
        wait_until(lambda: sample(relay, "outbox_relay_slices") == SLICES, timeout=30, what="leads")
        broker.signal(signal.SIGSTOP)
        try:
            with relay_bench.database.connect() as connection, connection.transaction():
                Outbox().publish_many(
                    connection,
                    [
                        Event(aggregate_type, str(n % 20), "Tick", {"n": n // 20})
                        for n in range(1000)
                    ],
                )
            time.sleep(6)  # the fault itself: three leases long, a batch waiting on the broker
        finally:
            broker.signal(signal.SIGCONT)
        wait_until(lambda: relay_bench.undelivered() == 0, timeout=60, what="outbox drained")
        assert sample(relay, "outbox_relay_leases_lost_total") == 0
        assert sample(relay, "outbox_relay_rebalances_total") == 1, "its slices never moved"
    records = read_until(
        relay_bench.kafka.bootstrap_servers,
        topic_for(aggregate_type),
        lambda r: len(r) >= 1000,
        timeout=60,
    )
    assert check_order(records, 1000) == 0, "a batch was sent twice"


def test_a_relay_that_needs_every_slice_is_not_counted_by_those_that_share(
    relay_bench: RelayBench,
) -> None:
    """An auto-mode relay beside a polling one (a mode change under way, or a replica
    configured apart): it stands by, and the polling relay keeps every slice instead of
    leaving a share to a relay that would never take it."""
    with relay_bench.in_thread() as polling:
        wait_until(
            lambda: sample(polling, "outbox_relay_slices") == SLICES, timeout=30, what="leads"
        )
        with relay_bench.in_thread(mode="auto") as auto:
            wait_until(
                lambda: auto.liveness.state.startswith("standby"), timeout=30, what="standby"
            )
            for _ in range(4):  # four of the polling relay's looks at the shares (0.5 s)
                assert sample(polling, "outbox_relay_slices") == SLICES
                assert sample(polling, "outbox_relay_slices_free") == 0
                time.sleep(0.5)  # an absence over time, not a condition to await
            assert sample(auto, "outbox_relay_slices") == 0
