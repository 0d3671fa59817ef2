"""Reading a topic back in tests: from the start, through the project's reading layer
(:mod:`outbox.kafka_reading`: committed records only, every record whatever its bytes), until
a condition holds."""

from __future__ import annotations

import time
from collections.abc import Callable

from outbox.core.errors import BrokerUnavailable
from outbox.core.kafka_record import KafkaRecord
from outbox.kafka_reading import KafkaReader, ReaderRole

ROLE = ReaderRole(client_id="outbox-tests", when_offsets_gone="earliest")


def read_until(
    bootstrap: str,
    topic: str,
    done: Callable[[list[KafkaRecord]], bool],
    *,
    timeout: float = 60,
) -> list[KafkaRecord]:
    """Records of ``topic`` from its start (all its partitions, each in offset order), read
    until ``done(records)`` or ``timeout``; the topic may appear meanwhile, and a broker that
    does not answer yet (coming back from a pause or a restart, briefly listing no broker in
    its metadata) is asked again until the deadline."""
    reader = KafkaReader(bootstrap, ROLE)
    records: list[KafkaRecord] = []
    deadline = time.monotonic() + timeout
    assigned = False
    try:
        while not done(records) and time.monotonic() < deadline:
            try:
                if not assigned:
                    partitions = reader.partitions([topic])
                    if not partitions:
                        time.sleep(0.2)  # a topic has no event to await
                        continue
                    reader.assign(partitions)
                    reader.seek_to_beginning(partitions)
                    assigned = True
                records.extend(reader.poll(0.5))
            except BrokerUnavailable:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.5)  # the broker is coming back: nothing to await but time
    finally:
        reader.close()
    return records


def read_count(bootstrap: str, topic: str, count: int, *, timeout: float = 60) -> list[KafkaRecord]:
    """Records of ``topic`` from its start, until ``count`` came or ``timeout`` passed."""
    return read_until(bootstrap, topic, lambda records: len(records) >= count, timeout=timeout)
