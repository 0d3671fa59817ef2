"""Broker refusals that can pass are retried, never dead letters; other aggregates go on.

The relay runs against the suite's real PostgreSQL and broker. The broker cannot be made to
answer ``TopicAuthorizationFailed`` or ``OutOfOrderSequenceNumber`` on demand, so for one
topic those answers are injected at the client's edge: the producer's ``send`` returns a
future failed with that error, exactly as kafka-python reports a refused batch.
"""

from __future__ import annotations

import itertools
import uuid
from typing import Any

import pytest
from kafka.errors import (
    InvalidProducerEpochError,
    OutOfOrderSequenceNumberError,
    TopicAuthorizationFailedError,
    UnknownProducerIdError,
)
from kafka.future import Future

from outbox import Event, Outbox
from outbox.core.contract import event_id_of, topic_for
from outbox_relay.producer import ContractProducer
from outbox_relay.settings import RelaySettings
from tests.fix_relay import RelayBench, sample, wait_until
from tests.kafka_read import read_until

pytestmark = pytest.mark.timeout(180)

TRANSIENT = (
    TopicAuthorizationFailedError,
    OutOfOrderSequenceNumberError,
    UnknownProducerIdError,
    InvalidProducerEpochError,
)


class RefusingBroker:
    """Refuses every record of ``topic`` while ``refusing``, cycling through ``errors``."""

    def __init__(self, topic: str) -> None:
        self.topic = topic
        self.refusing = True
        self.refused = 0
        self._errors = itertools.cycle(TRANSIENT)

    def producer_class(self) -> type[ContractProducer]:
        broker = self

        class Refusing(ContractProducer):
            def __init__(self, bootstrap_servers: str, settings: RelaySettings) -> None:
                super().__init__(bootstrap_servers, settings)
                real_send = self._producer.send

                def send(topic: str, **kwargs: Any) -> Any:
                    if broker.refusing and topic == broker.topic:
                        broker.refused += 1
                        return Future().failure(next(broker._errors)())
                    return real_send(topic, **kwargs)

                self._producer.send = send

        return Refusing


def ids(records: list[Any]) -> list[uuid.UUID]:
    return [event_id_of(record.headers) for record in records]


def test_transient_refusals_wait_in_order_while_other_aggregates_flow(
    relay_bench: RelayBench, monkeypatch: pytest.MonkeyPatch
) -> None:
    refused_type, healthy_type = f"x{uuid.uuid4().hex[:10]}", f"h{uuid.uuid4().hex[:10]}"
    broker = RefusingBroker(topic_for(refused_type))
    monkeypatch.setattr("outbox_relay.sender.ContractProducer", broker.producer_class())
    written: dict[str, list[uuid.UUID]] = {refused_type: [], healthy_type: []}
    with relay_bench.database.connect() as connection:
        for n in range(30):  # one transaction each, interleaved: one position order
            for aggregate_type in (refused_type, healthy_type):
                event = Event(aggregate_type, str(n % 3), "Tick", {"n": n})
                with connection.transaction():
                    Outbox().publish(connection, event)
                written[aggregate_type].append(event.event_id)
    with relay_bench.in_thread(batch_size=7) as relay:
        healthy = read_until(
            relay_bench.kafka.bootstrap_servers,
            topic_for(healthy_type),
            lambda r: len(set(ids(r))) >= 30,
            timeout=60,
        )
        assert set(ids(healthy)) == set(written[healthy_type]), "a refused topic stopped others"
        wait_until(lambda: broker.refused >= 12, timeout=30, what="refused again and again")
        assert sample(relay, "outbox_relay_dead_lettered_total") == 0
        assert relay_bench.undelivered() == 30, "only the refused aggregate's rows wait"
        for error in TRANSIENT:
            assert sample(relay, "outbox_relay_retried_total", error=error.__name__) > 0
        assert sample(relay, "outbox_relay_parked_aggregates") >= 1
        broker.refusing = False  # the ACL appears, the producer state is fresh again
        wait_until(lambda: relay_bench.undelivered() == 0, timeout=60, what="the rest delivered")
    records = read_until(
        relay_bench.kafka.bootstrap_servers,
        topic_for(refused_type),
        lambda r: len(set(ids(r))) >= 30,
        timeout=60,
    )
    by_aggregate: dict[bytes, list[uuid.UUID]] = {}
    for record in records:
        by_aggregate.setdefault(record.key, []).append(event_id_of(record.headers))
    expected: dict[bytes, list[uuid.UUID]] = {}
    for n, event_id in enumerate(written[refused_type]):
        expected.setdefault(str(n % 3).encode(), []).append(event_id)
    assert by_aggregate == expected, "the aggregate that waited is out of order or duplicated"
    with relay_bench.database.connect() as connection:
        row = connection.execute("SELECT count(*) FROM outbox.outbox_dead_letter").fetchone()
    assert row == (0,)


def test_a_row_is_sorted_by_the_brokers_answer() -> None:
    """The pure decision behind it: permanent for the record, or not."""
    from kafka.errors import KafkaTimeoutError, MessageSizeTooLargeError

    from outbox_relay.failures import is_permanent, is_unreachable

    assert is_permanent(MessageSizeTooLargeError())
    for error in TRANSIENT:
        assert not is_permanent(error()) and not is_unreachable(error())
    assert is_unreachable(KafkaTimeoutError()) and is_unreachable(None)
