"""One contract suite over every delivery path: CDC (Debezium) and the polling relay.

Each test runs once per path (``path`` is parametrized): events written with the SDK into the
path's own database, read back from the suite's broker. The contract is
:func:`outbox.core.contract.record_for` of the row the path read: topic, key, value and
headers, byte for byte, in order. The expected records are read from the outbox inside the
writing transaction (the relay deletes a row once it is published), so the ``position``
header is that database's own: each path is held to the exact bytes of its own rows, and
since both are held to the one function, a consumer cannot tell the paths apart.
"""

from __future__ import annotations

import random
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest

from outbox import Event, Outbox
from outbox.core.contract import ContractRecord, event_id_of, record_for, topic_for
from tests.concurrency import run_in_threads
from tests.fix_cdc import CdcPath
from tests.fix_postgres import ScratchDatabase
from tests.fix_relay import RelayBench
from tests.kafka_read import read_until

pytestmark = pytest.mark.timeout(240)

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


@dataclass(frozen=True)
class DeliveryPath:
    """A running path from a database's outbox to the broker."""

    name: str
    database: ScratchDatabase
    bootstrap_servers: str

    def read(
        self, topic: str, done: Callable[[list[Any]], bool], *, timeout: float = 60
    ) -> list[Any]:
        """``topic`` from its start, until ``done(records)`` or ``timeout``."""
        return read_until(self.bootstrap_servers, topic, done, timeout=timeout)

    def read_count(self, topic: str, count: int, *, timeout: float = 60) -> list[Any]:
        return self.read(topic, lambda records: len(records) >= count, timeout=timeout)


@pytest.fixture(params=["cdc", "relay"])
def path(request: pytest.FixtureRequest) -> Iterator[DeliveryPath]:
    if request.param == "cdc":
        cdc: CdcPath = request.getfixturevalue("cdc")
        yield DeliveryPath("cdc", cdc.database, cdc.kafka.bootstrap_servers)
    else:
        bench: RelayBench = request.getfixturevalue("relay_bench")
        with bench.in_thread():
            yield DeliveryPath("relay", bench.database, bench.kafka.bootstrap_servers)


def fresh_type() -> str:
    """An aggregate type of its own, so each test reads a topic of its own."""
    return f"c{uuid.uuid4().hex[:10]}"


def publish_and_expect(path: DeliveryPath, events: list[Event]) -> list[ContractRecord]:
    """Publish ``events`` in one transaction; the contract records of their rows, read in
    that transaction (before the path can see, or the relay delete, them)."""
    with path.database.connect() as connection, connection.transaction():
        Outbox().publish_many(connection, events)
        rows = connection.execute(
            "SELECT id, aggregatetype, aggregateid, type, payload::text, headers::text, "
            "traceparent, position FROM outbox.outbox WHERE id = ANY(%s) ORDER BY position",
            ([event.event_id for event in events],),
        ).fetchall()
    return [
        record_for(
            event_id=r[0],
            aggregate_type=r[1],
            aggregate_id=r[2],
            event_type=r[3],
            payload_text=r[4],
            headers_text=r[5],
            traceparent=r[6],
            position=r[7],
        )
        for r in rows
    ]


def test_a_commit_produces_exactly_the_contract_record(path: DeliveryPath) -> None:
    aggregate_type = fresh_type()
    events = [
        Event(
            aggregate_type,
            "42",
            "OrderPlaced",
            {"total": "9.90", "é": [1, None], "nested": {"b": 1, "a": "x"}},
            headers={"tenant": "acme"},
            traceparent=TRACEPARENT,
        ),
        Event(aggregate_type, "42", "OrderPaid", {}),
        Event(aggregate_type, "7", "OrderPlaced", {"lines": [{"sku": "A-1", "qty": 2}]}),
    ]
    expected = publish_and_expect(path, events)
    assert len(expected) == 3
    received = path.read_count(topic_for(aggregate_type), 3)
    # Per aggregate (the order the contract keeps; aggregates may share no partition).
    on_kafka: dict[bytes, list[tuple[Any, ...]]] = defaultdict(list)
    for m in received:
        on_kafka[m.key].append((m.topic, m.key, m.value, tuple(m.headers)))
    wanted: dict[bytes, list[tuple[Any, ...]]] = defaultdict(list)
    for e in expected:
        wanted[e.key].append((e.topic, e.key, e.value, e.headers))
    assert on_kafka == wanted
    assert {event_id_of(m.headers) for m in received} == {e.event_id for e in events}
    # One aggregate, one partition: its order is kept for every consumer.
    assert len({m.partition for m in received if m.key == b"42"}) == 1


def test_a_rolled_back_transaction_produces_nothing(path: DeliveryPath) -> None:
    aggregate_type = fresh_type()
    with path.database.connect() as connection:
        with connection.transaction():
            Outbox().publish(connection, Event(aggregate_type, "1", "Ghost", {}))
            raise psycopg.Rollback
        with connection.transaction():
            sentinel = Outbox().publish(connection, Event(aggregate_type, "1", "Real", {}))
    received = path.read_count(topic_for(aggregate_type), 2, timeout=15)
    assert [event_id_of(m.headers) for m in received] == [sentinel.event_id]


def test_concurrent_writers_arrive_in_per_aggregate_commit_order(path: DeliveryPath) -> None:
    """1,000 events over 50 aggregates, from 4 writers at once: per aggregate, the order on
    Kafka is the order of the outbox positions, which is commit order (test_ordering)."""
    aggregate_type = fresh_type()
    written: dict[uuid.UUID, int] = {}  # event id -> its row's position

    def writer(seed: int) -> None:
        rng = random.Random(seed)
        for _number in range(50):
            events = [
                Event(aggregate_type, str(rng.randrange(50)), "Changed", {"writer": seed, "i": i})
                for i in range(5)
            ]
            for record in publish_and_expect(path, events):
                written[event_id_of(record.headers)] = int(dict(record.headers)["position"])

    run_in_threads(writer, 4, timeout=120)
    assert len(written) == 1000
    received = path.read(
        topic_for(aggregate_type),
        lambda records: len({event_id_of(r.headers) for r in records}) >= 1000,
        timeout=120,
    )
    on_kafka: dict[bytes, list[int]] = defaultdict(list)
    seen: set[uuid.UUID] = set()
    for message in received:  # first copies (a path may deliver twice, never out of order)
        event_id = event_id_of(message.headers)
        if event_id not in seen:
            seen.add(event_id)
            on_kafka[message.key].append(written[event_id])
    assert seen == set(written)
    for key, positions in on_kafka.items():
        assert positions == sorted(positions), f"aggregate {key!r} out of commit order"
