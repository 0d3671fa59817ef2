"""The polling relay under faults, while an application writes: the broker paused for 30 s,
PostgreSQL restarted, and (auto mode) Kafka Connect killed and started again. Every event
whose commit returned reaches Kafka; nothing else does; duplicates carry the same id."""

from __future__ import annotations

import json
import signal
import time
import uuid
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import pytest

from outbox.core.contract import event_id_of, topic_for
from outbox_relay.service import Relay
from tests.fix_cdc import cdc_path_for
from tests.fix_relay import RelayBench, sample, wait_until
from tests.kafka_read import read_until
from tests.writers import Writer

pytestmark = pytest.mark.timeout(300)


def check_delivery(bench: RelayBench, writer: Writer, *, copies: str = "first") -> list[Any]:
    """Every committed event arrived, no event that was never tried, per-aggregate order of
    first arrivals equal to commit order. Returns the records.

    ``copies="last"`` checks the order of each event's last copy instead: the guarantee of a
    sender that, after a failed send it cannot retry, sends again everything from its last
    confirmed record (Kafka Connect after a broker error it does not retry); see
    tests/integration/test_stack_durable.py."""
    assert not writer.is_alive() and not writer.errors, writer.errors
    expected = set(writer.committed)

    def ids(records: list[Any]) -> set[uuid.UUID]:
        return {event_id_of(record.headers) for record in records}

    records = read_until(
        bench.kafka.bootstrap_servers,
        topic_for(writer.aggregate_type),
        lambda r: ids(r) >= expected,
        timeout=120,
    )
    seen = ids(records)
    assert expected <= seen, f"{len(expected - seen)} committed events never arrived"
    assert seen <= writer.attempted, "an event that was never written arrived"
    order = {event_id: n for n, event_id in enumerate(writer.committed)}
    assert copies in ("first", "last")
    arrivals = records if copies == "first" else list(reversed(records))
    firsts: dict[bytes, list[int]] = defaultdict(list)
    first_seen: set[uuid.UUID] = set()
    for record in arrivals:
        event_id = event_id_of(record.headers)
        if event_id not in first_seen and event_id in order:
            first_seen.add(event_id)
            firsts[record.key].append(order[event_id])
    for key, positions in firsts.items():
        if copies == "last":
            positions.reverse()
        assert positions == sorted(positions), (
            f"aggregate {key!r} out of commit order ({copies} copies)"
        )
    return records


def run_with_fault(
    bench: RelayBench, relay_settings: dict[str, Any], fault: Callable[[Relay], None]
) -> Relay:
    writer = Writer(
        bench.database.conninfo, f"f{uuid.uuid4().hex[:10]}", batches=300, pace_seconds=0.02
    )
    with bench.in_thread(**relay_settings) as relay:
        writer.start()
        writer.wait_for(75)
        fault(relay)
        writer.join(timeout=200)
        wait_until(lambda: bench.undelivered() == 0, timeout=120, what="outbox drained")
    check_delivery(bench, writer)
    return relay


def test_no_loss_when_the_broker_is_paused_for_30_seconds(relay_bench: RelayBench) -> None:
    def pause_broker(relay: Relay) -> None:
        relay_bench.kafka.broker.process.signal(signal.SIGSTOP)
        try:
            time.sleep(30)  # the fault itself: the broker frozen for 30 s while writes go on
        finally:
            relay_bench.kafka.broker.process.signal(signal.SIGCONT)

    relay = run_with_fault(relay_bench, {}, pause_broker)
    assert relay.metrics.registry.get_sample_value(
        "outbox_relay_errors_total", {"kind": "broker"}
    ), "the pause never showed as a broker error: was the relay publishing?"


def test_the_relay_reconnects_when_postgres_restarts(relay_bench: RelayBench) -> None:
    def restart_postgres(relay: Relay) -> None:
        relay_bench.database.cluster.restart()

    relay = run_with_fault(relay_bench, {}, restart_postgres)
    assert relay.metrics.registry.get_sample_value(
        "outbox_relay_errors_total", {"kind": "database"}
    )


def test_auto_mode_takes_over_when_connect_dies_and_steps_back_when_it_returns(
    relay_bench: RelayBench,
) -> None:
    kafka = relay_bench.kafka
    with cdc_path_for(kafka, relay_bench.database) as cdc:
        settings = {"mode": "auto", "grace_seconds": 3.0}
        writer = Writer(
            relay_bench.database.conninfo,
            f"a{uuid.uuid4().hex[:10]}",
            batches=400,
            pace_seconds=0.05,
        )
        with relay_bench.in_thread(
            cdc_topic_prefix=cdc.connector.topic_prefix, **settings
        ) as relay:
            writer.start()
            writer.wait_for(50)
            # CDC delivers; the relay only confirms and cleans up.
            wait_until(
                lambda: sample(relay, "outbox_relay_cdc_confirmed_total") > 0,
                timeout=60,
                what="the relay sees CDC's records and deletes their rows",
            )
            assert sample(relay, "outbox_relay_takeovers_total") == 0
            kafka.connect.process.signal(signal.SIGKILL)
            wait_until(
                lambda: not kafka.connect.process.is_running(), timeout=30, what="Connect gone"
            )
            wait_until(
                lambda: sample(relay, "outbox_relay_takeovers_total") >= 1,
                timeout=30,
                what="the relay takes over",
            )
            assert sample(relay, "outbox_relay_publishing") == 1
            # The writes end while Connect is down: the relay publishes them all, then the
            # outbox stays empty. It must still step back once CDC streams again.
            writer.join(timeout=200)
            wait_until(lambda: relay_bench.undelivered() == 0, timeout=120, what="drained")
            kafka.start_connect()
            cdc.client.wait_running(cdc.connector.name, timeout=120)
            wait_until(
                lambda: sample(relay, "outbox_relay_stepbacks_total") >= 1,
                timeout=90,
                what="the relay steps back once CDC streams again",
            )
            assert sample(relay, "outbox_relay_publishing") == 0
            assert sample(relay, "outbox_relay_published_total") > 0
        records = check_delivery(relay_bench, writer)
        # CDC delivered events too (before the kill).
        assert len(records) > sample(relay, "outbox_relay_published_total")
        assert all(json.loads(record.value)["n"] in range(10) for record in records)
