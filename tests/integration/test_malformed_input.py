"""Malformed input outside the lake: the idempotent consumer never crash-loops on a record it
cannot decode, and the SDK checks payloads against what the lake can type."""

from __future__ import annotations

import uuid
import warnings
from typing import Any

import pytest
import sqlalchemy as sa
from kafka import KafkaProducer

from outbox import Event, LakeContractError, LakeContractWarning, Outbox, OutboxSettings
from outbox.consumer import IdempotentConsumer, ReceivedEvent
from outbox.core.contract import record_for, topic_for
from tests.fix_postgres import ScratchDatabase
from tests.fix_relay import RelayBench, wait_until

FAST_GROUP = {
    "session_timeout_ms": 6000,
    "heartbeat_interval_ms": 1000,
    "max_poll_interval_ms": 6000,
}


def test_undecodable_records_go_to_the_dead_letters_and_the_consumer_goes_on(
    relay_bench: RelayBench,
) -> None:
    aggregate_type = f"m{uuid.uuid4().hex[:8]}"
    topic = topic_for(aggregate_type)
    good = record_for(
        event_id=uuid.uuid4(),
        aggregate_type=aggregate_type,
        aggregate_id="1",
        event_type="Happened",
        payload_text='{"ok": true}',
        headers_text="{}",
        traceparent="",
        position=1,
    )
    headers = list(good.headers)
    bad_records = [
        (b"\xff\xfe", good.value, headers),  # key not UTF-8
        (good.key, b"\xc3(", headers),  # value not UTF-8
        (good.key, b'{"deep": ' + b"[" * 5000 + b"]" * 5000 + b"}", headers),
        (good.key, good.value, [("id", b"\x00\xff"), ("eventType", b"X")]),
        # Not an event, and NUL in a header: PostgreSQL text and jsonb refuse NUL.
        (good.key, good.value, [("id", b"bad\x00id"), ("we\x00ird", b"\x00")]),
    ]
    producer = KafkaProducer(bootstrap_servers=relay_bench.kafka.bootstrap_servers)
    for key, value, record_headers in bad_records:
        producer.send(topic, key=key, value=value, headers=record_headers)
    producer.send(topic, key=good.key, value=good.value, headers=headers)
    producer.flush()
    producer.close()

    applied: list[ReceivedEvent] = []
    engine = sa.create_engine(relay_bench.database.url)
    consumer: IdempotentConsumer[Any] = IdempotentConsumer(
        name=f"c{uuid.uuid4().hex[:6]}",
        topics=[topic],
        group_id=f"g{uuid.uuid4().hex[:6]}",
        bootstrap_servers=relay_bench.kafka.bootstrap_servers,
        begin=engine.begin,
        handler=lambda _connection, event: applied.append(event),
        consumer_options=FAST_GROUP,
    )
    try:
        wait_until(
            lambda: consumer.poll_once(timeout_seconds=0.5) >= 0 and len(applied) == 1,
            timeout=90,
            what="the good record applied after the bad ones",
        )
    finally:
        consumer.close()
        engine.dispose()
    assert consumer.stats.dead_lettered == len(bad_records)
    with relay_bench.database.connect() as connection:
        reasons = [
            row[0]
            for row in connection.execute(
                "SELECT reason FROM outbox.outbox_inbox_dead_letter WHERE topic = %s", (topic,)
            )
        ]
    assert len(reasons) == len(bad_records)
    assert any("key is not UTF-8" in reason for reason in reasons)
    assert any("nested too deeply" in reason for reason in reasons)


def test_the_sdk_warns_or_refuses_a_payload_the_lake_cannot_type(
    database: ScratchDatabase,
) -> None:
    engine = sa.create_engine(database.url)
    bad = {"big": 2**64, "Total": 1, "total": 2}
    try:
        with engine.connect() as connection, connection.begin():
            with pytest.warns(LakeContractWarning, match=r"'big' = 18446744073709551616"):
                Outbox().publish(connection, Event("ledger", "1", "Booked", bad))
            with pytest.raises(LakeContractError) as refused:
                Outbox(OutboxSettings(lake_contract="strict")).publish(
                    connection, Event("ledger", "1", "Booked", bad)
                )
            assert len(refused.value.problems) == 2
            assert "'Total' and 'total' differ only in case" in refused.value.problems[1]
            only_orders = Outbox(OutboxSettings(lake_contract="off", lake_strict_types={"order"}))
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                only_orders.publish(connection, Event("ledger", "1", "Booked", bad))
                with pytest.raises(LakeContractError):
                    only_orders.publish(connection, Event("order", "1", "Placed", bad))
                Outbox().publish(connection, Event("ledger", "1", "Booked", {"fine": 1}))
            connection.rollback()
    finally:
        engine.dispose()
