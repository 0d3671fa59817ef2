"""Effects on a third party under ``kill -9``: at most once, and never lost.

A real broker and PostgreSQL, a local HTTP payment provider that counts requests per
idempotency key and does not deduplicate, and the billing consumer in a child process
(tests/effects_consumer.py) that SIGKILLs itself once at each point: before the call, after
the call before *done*, and after *done* before the offset commit. It is restarted after
each kill; every record is also on the topic twice.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaAdminClient, KafkaProducer

from outbox.core.contract import record_for, topic_for
from outbox.core.effects import idempotency_key
from outbox_examples.payment_provider import PaymentProvider
from tests.cli import run_outbox
from tests.fix_postgres import ROOT
from tests.fix_relay import RelayBench

pytestmark = pytest.mark.timeout(360)

ORDERS = 10
CRASHES = {"before_call": 3, "after_call": 6, "after_done": 8}


def publish_twice(bootstrap: str, topic: str) -> dict[int, str]:
    """Orders 1..ORDERS as contract records, all of them sent twice; order -> event id."""
    events = {n: str(uuid.uuid4()) for n in range(1, ORDERS + 1)}
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all")
    for _ in range(2):
        for n, event_id in events.items():
            record = record_for(
                event_id=uuid.UUID(event_id),
                aggregate_type=topic.removeprefix("outbox.event."),
                aggregate_id=str(n),
                event_type="OrderPlaced",
                payload_text=json.dumps({"order_id": n, "total": f"{n}.00"}),
                headers_text="{}",
                traceparent=None,
                position=n,
            )
            producer.send(topic, key=record.key, value=record.value, headers=list(record.headers))
    producer.flush()
    producer.close()
    return events


class Bench:
    def __init__(self, relay_bench: RelayBench, tmp: Path, mode: str, lookup: bool) -> None:
        self.database = relay_bench.database
        self.bootstrap = relay_bench.kafka.bootstrap_servers
        self.topic = topic_for(f"e{uuid.uuid4().hex[:10]}")
        self.group = f"billing-{uuid.uuid4().hex[:8]}"
        self.tmp = tmp
        self.provider = PaymentProvider().start()
        self.env = {
            "OUTBOX_DATABASE_URL": self.database.url,
            "EFFECTS_BOOTSTRAP": self.bootstrap,
            "EFFECTS_TOPIC": self.topic,
            "EFFECTS_GROUP": self.group,
            "EFFECTS_PROVIDER": self.provider.url,
            "EFFECTS_MODE": mode,
            "EFFECTS_LOOKUP": "1" if lookup else "0",
            # The counting provider records a charge as its request arrives: one sent by a
            # killed child has arrived within a second or never will. A longer settle time
            # would make the restarted child wait past its group's max.poll.interval (6 s).
            "EFFECTS_SETTLE_SECONDS": "2",
            "EFFECTS_CRASH_PLAN": ",".join(f"{p}:{n}" for p, n in CRASHES.items()),
            "EFFECTS_CRASH_MARKS": str(tmp),
            "PYTHONPATH": str(ROOT),
        }
        self.children: list[subprocess.Popen[bytes]] = []
        self.offsets = KafkaAdminClient(bootstrap_servers=self.bootstrap)

    def start(self) -> subprocess.Popen[bytes]:
        with (self.tmp / f"child-{len(self.children)}.log").open("ab") as log:
            child = subprocess.Popen(
                [sys.executable, "-m", "tests.effects_consumer"],
                env={**os.environ, **self.env},
                cwd=ROOT,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self.children.append(child)
        return child

    def logs(self) -> str:
        return "\n".join(p.read_text()[-1500:] for p in sorted(self.tmp.glob("child-*.log")))

    def committed(self) -> int:
        """Records consumed and committed by the group, over all partitions of the topic."""
        offsets = self.offsets.list_group_offsets({self.group: None}).get(self.group, {})
        return sum(
            max(committed.offset, 0)
            for partition, committed in offsets.items()
            if partition.topic == self.topic
        )

    def steps(self) -> dict[str, tuple[str, str | None]]:
        with self.database.connect() as connection:
            rows = connection.execute(
                "SELECT event_id, state, reference FROM outbox.outbox_inbox_effect "
                "WHERE consumer = 'billing'"
            ).fetchall()
        return {row[0]: (row[1], row[2]) for row in rows}

    def run_until(self, condition: Any, *, timeout: float = 90) -> int | None:
        """Start a child; None when ``condition()`` held (child stopped), else its exit code."""
        child = self.start()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if child.poll() is not None:
                return child.returncode
            if condition():
                child.send_signal(signal.SIGTERM)
                assert child.wait(timeout=30) == 0, self.logs()
                return None
            time.sleep(0.1)
        raise AssertionError(
            f"the consumer did not finish within {timeout} s (committed {self.committed()}, "
            f"steps {sorted(s for s, _ in self.steps().values())}):\n{self.logs()}"
        )

    def close(self) -> None:
        for child in self.children:
            if child.poll() is None:
                child.kill()
                child.wait(timeout=10)
        self.offsets.close()
        self.provider.stop()


@pytest.mark.parametrize(
    ("mode", "lookup"),
    [("plain", True), ("plain", False), ("inbox", True)],
    ids=["with-lookup", "without-lookup", "inbox-consumer-with-lookup"],
)
def test_every_effect_at_most_once_across_kill_9_at_each_point(
    relay_bench: RelayBench, tmp_path: Path, mode: str, lookup: bool
) -> None:
    bench = Bench(relay_bench, tmp_path, mode, lookup)
    try:
        events = publish_twice(bench.bootstrap, bench.topic)
        key = {n: str(idempotency_key("billing", e, "charge")) for n, e in events.items()}

        exits = []
        for _ in range(len(CRASHES) + 1):
            code = bench.run_until(lambda: bench.committed() >= 2 * ORDERS)
            if code is None:
                break
            exits.append(code)
        assert exits == [-signal.SIGKILL] * len(CRASHES), bench.logs()
        assert sorted(p.name for p in tmp_path.glob("*-*") if "child" not in p.name) == sorted(
            f"{p}-{n}" for p, n in CRASHES.items()
        )

        counts = bench.provider.counts()
        assert all(count == 1 for count in counts.values()), f"charged twice: {counts}"
        steps = bench.steps()
        assert set(steps) == set(events.values()), "every event has its step: none lost"
        parked = {n for n, e in events.items() if steps[e][0] == "needs_decision"}
        if lookup:
            assert parked == set(), steps
            assert set(counts) == set(key.values()), "with a lookup: every charge exactly once"
            for n, event_id in events.items():
                assert steps[event_id] == ("done", bench.provider.find(key[n]))
        else:
            # Cut short before or after the call: nobody can tell, so both wait for a human.
            assert parked == {CRASHES["before_call"], CRASHES["after_call"]}
            assert key[CRASHES["before_call"]] not in counts
            assert counts[key[CRASHES["after_call"]]] == 1
            resolve_as_an_operator(bench, events, key, parked)
        if mode == "inbox":
            with relay_bench.database.connect() as connection:
                charges = dict(
                    connection.execute("SELECT event_id, charge_id FROM billing.charges")
                )
            assert charges == {e: steps[e][1] for e in events.values()}
    finally:
        bench.close()


def resolve_as_an_operator(
    bench: Bench, events: dict[int, str], key: dict[int, str], parked: set[int]
) -> None:
    """List the parked charges (CLI), ask the provider about each key, decide (CLI)."""
    env = {"OUTBOX_DATABASE_URL": bench.database.url}
    listed = run_outbox("effects", "list", "--json", env=env)
    assert listed.returncode == 0, listed.stderr
    steps = {(step["event_id"], step["idempotency_key"]) for step in json.loads(listed.stdout)}
    assert steps == {(events[n], key[n]) for n in parked}
    assert "2 step(s) need a decision" in listed.stderr
    for n in parked:
        found = bench.provider.find(key[n])
        if found is not None:
            args = ["mark-done", "billing", events[n], "charge", "--reference", found]
        else:
            args = ["release", "billing", events[n], "charge"]
        decided = run_outbox("effects", *args, env=env)
        assert decided.returncode == 0, decided.stderr
    # The next start performs the released charge (examples/outbox_examples/payment_effects.py does
    # too).
    done = bench.run_until(lambda: all(s[0] == "done" for s in bench.steps().values()))
    assert done is None
    counts = bench.provider.counts()
    assert sorted(counts) == sorted(key.values()) and set(counts.values()) == {1}
    empty = run_outbox("effects", "list", env=env)
    assert "0 step(s) need a decision" in empty.stderr
    with bench.database.connect() as connection:
        references = dict(
            connection.execute(
                "SELECT event_id, reference FROM outbox.outbox_inbox_effect "
                "WHERE consumer = 'billing'"
            )
        )
    assert references == {e: bench.provider.find(key[n]) for n, e in events.items()}


def test_the_provider_counts_and_finds_by_key() -> None:
    provider = PaymentProvider().start()
    try:
        from outbox.effects import EffectNotPerformedError, EffectStep
        from outbox_examples.payment_effects import ProviderClient

        client = ProviderClient(provider.url)
        step = EffectStep("billing", "e1", "charge", uuid.uuid4(), 1, {"amount": "1.00"})
        assert client.find(step).answer.value == "not_happened"
        charge_id = client.charge(step)
        assert client.find(step).reference == charge_id
        assert provider.counts() == {str(step.idempotency_key): 1}
        client.charge(step)  # the provider does not deduplicate: that is the point
        assert provider.counts() == {str(step.idempotency_key): 2}
    finally:
        provider.stop()
    with pytest.raises(EffectNotPerformedError, match="refused the connection"):
        client.charge(step)  # nothing listens any more: certainly not charged
