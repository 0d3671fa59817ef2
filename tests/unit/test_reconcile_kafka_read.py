"""Reconcile never reports a partition read short (issue 22, item 10): a broker that stops
answering for a partition before its end is an error naming the partition and its offsets.
Before, the default scan mode took a partition quiet for ``idle_seconds`` as read to its end,
and made its report of what had been read. kafka-python's consumer is replaced by a fake that
serves part of a partition and then nothing."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from kafka import TopicPartition

from outbox.core.errors import ShortReadError
from outbox_reconcile.evidence import Evidence
from outbox_reconcile.kafka_reader import read_kafka
from outbox_reconcile.records import Window


class _StalledBroker:
    """kafka-python's ``KafkaConsumer`` as reconcile uses it, over one partition whose end is
    10: it serves offsets 0 to 4, then nothing (a broker that stopped answering for it for a
    while, as a slow or paused one does)."""

    topic = "outbox.event.stalled"

    class _Fetcher:
        PartitionRecords = object

    def __init__(self, **options: Any) -> None:
        self._fetcher = self._Fetcher()
        self._position = 0
        self._served = False

    def topics(self) -> set[str]:
        return {self.topic}

    def partitions_for_topic(self, topic: str) -> set[int]:
        return {0}

    def beginning_offsets(self, tps: list[Any]) -> dict[Any, int]:
        return dict.fromkeys(tps, 0)

    def end_offsets(self, tps: list[Any]) -> dict[Any, int]:
        return dict.fromkeys(tps, 10)

    def assign(self, tps: list[Any]) -> None:
        self._assigned = set(tps)

    def assignment(self) -> set[Any]:
        return getattr(self, "_assigned", set())

    def seek(self, tp: Any, offset: int) -> None:
        self._position = offset

    def pause(self, *tps: Any) -> None:
        pass

    def position(self, tp: Any) -> int:
        return self._position

    def poll(self, timeout_ms: int = 0, max_records: int | None = None) -> dict[Any, list[Any]]:
        if self._served:
            time.sleep(timeout_ms / 1000)
            return {}
        self._served = True
        self._position = 5
        tp = TopicPartition(self.topic, 0)
        return {tp: [self._record(offset) for offset in range(5)]}

    def _record(self, offset: int) -> Any:
        headers = [("id", str(uuid.uuid4()).encode()), ("position", str(offset).encode())]
        return SimpleNamespace(
            topic=self.topic,
            partition=0,
            offset=offset,
            timestamp=int(time.time() * 1000),
            key=b"1",
            value=b"{}",
            headers=headers,
        )

    def close(self, autocommit: bool = True) -> None:
        pass


@pytest.fixture
def stalled_broker(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    import kafka

    monkeypatch.setattr(kafka, "KafkaConsumer", _StalledBroker)
    yield


@pytest.mark.timeout(30)
@pytest.mark.usefixtures("stalled_broker")
def test_reconcile_never_reports_a_partition_read_short() -> None:
    """Issue 22, item 10: in scan mode a partition that went quiet for ``idle_seconds`` was
    taken as read to its end, and the report was made of what had been read."""
    evidence = Evidence()
    try:
        with pytest.raises(ShortReadError) as short:
            read_kafka("fake:9092", r"^outbox\.event\.", evidence, Window(), stall_seconds=1.0)
    finally:
        evidence.close()
    error = short.value
    assert (error.topic, error.partition, error.start, error.reached, error.end) == (
        _StalledBroker.topic,
        0,
        0,
        5,
        10,
    )
