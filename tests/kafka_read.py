"""Reading a topic back in tests: from the start, with one consumer, until a condition holds."""

from __future__ import annotations

import time
from collections.abc import Callable

from kafka import KafkaConsumer


def read_until(
    bootstrap: str,
    topic: str,
    done: Callable[[list[object]], bool],
    *,
    timeout: float = 60,
    isolation_level: str = "read_committed",
) -> list[object]:
    """Records of ``topic`` from its start, read until ``done(records)`` or ``timeout``;
    committed records only, as every reader of the project reads, unless told otherwise."""
    consumer = KafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        isolation_level=isolation_level,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        consumer_timeout_ms=500,
    )
    records: list[object] = []
    deadline = time.monotonic() + timeout
    try:
        while not done(records) and time.monotonic() < deadline:
            records.extend(consumer)
    finally:
        consumer.close()
    return records


def read_count(bootstrap: str, topic: str, count: int, *, timeout: float = 60) -> list[object]:
    """Records of ``topic`` from its start, until ``count`` came or ``timeout`` passed."""
    return read_until(bootstrap, topic, lambda records: len(records) >= count, timeout=timeout)
