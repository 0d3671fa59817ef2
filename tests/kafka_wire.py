"""Records crafted on the wire: a record batch built byte by byte, sent in a ProduceRequest.

For records no Python client would write but Apache Kafka accepts from any producer (Go, C,
Java): a header name that is not UTF-8 (the broker keeps a header name as bytes; Java reads it
leniently). Nothing here goes through kafka-python's record code: the batch is laid out as
Kafka's message format v2 says (https://kafka.apache.org/documentation/#recordbatch) and
sent on a socket of its own (Produce v3, ``acks=all``) to a broker that leads the partition.
"""

from __future__ import annotations

import gzip
import socket
import struct
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from kafka import KafkaAdminClient, KafkaProducer
from kafka.admin import NewTopic
from kafka.record.util import calc_crc32c

from outbox import new_event_id
from outbox.core.contract import ContractRecord, record_for, topic_for

BAD_NAME = b"\xff\xfe-trace"
"""A header name that is not UTF-8 (Java producers write whatever bytes they are given)."""

__all__ = [
    "BAD_NAME",
    "WireRecord",
    "contract_record",
    "craft_bad_record",
    "own_topic",
    "produce_batch",
    "record_batch",
    "send",
]


@dataclass(frozen=True)
class WireRecord:
    key: bytes | None
    value: bytes | None
    headers: list[tuple[bytes, bytes | None]] = field(default_factory=list)
    """Header names as raw bytes: anything at all, UTF-8 or not."""


def _varint(number: int) -> bytes:
    """Kafka's signed varint: zigzag, then 7 bits a byte, lowest first."""
    zigzag = (number << 1) ^ (number >> 63)
    out = bytearray()
    while True:
        byte = zigzag & 0x7F
        zigzag >>= 7
        if zigzag:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _sized(data: bytes | None) -> bytes:
    return _varint(-1) if data is None else _varint(len(data)) + data


def _record(index: int, record: WireRecord) -> bytes:
    body = (
        b"\x00"  # attributes
        + _varint(0)  # timestamp delta
        + _varint(index)  # offset delta
        + _sized(record.key)
        + _sized(record.value)
        + _varint(len(record.headers))
        + b"".join(_varint(len(name)) + name + _sized(value) for name, value in record.headers)
    )
    return _varint(len(body)) + body


def record_batch(
    records: list[WireRecord], *, timestamp_ms: int | None = None, gzipped: bool = False
) -> bytes:
    """One non-transactional batch of ``records`` (base offset 0: the broker assigns the
    offsets), its records gzip-compressed or not."""
    stamp = int(time.time() * 1000) if timestamp_ms is None else timestamp_ms
    body = b"".join(_record(index, record) for index, record in enumerate(records))
    after_crc = struct.pack(
        ">hiqqqhii",
        1 if gzipped else 0,  # attributes: compression, create time, not transactional
        len(records) - 1,  # last offset delta
        stamp,  # base timestamp
        stamp,  # max timestamp
        -1,  # producer id
        -1,  # producer epoch
        -1,  # base sequence
        len(records),
    ) + (gzip.compress(body) if gzipped else body)
    after_length = struct.pack(">ibI", -1, 2, calc_crc32c(after_crc)) + after_crc
    return struct.pack(">qi", 0, len(after_length)) + after_length


def _string(text: str) -> bytes:
    data = text.encode()
    return struct.pack(">h", len(data)) + data


def produce_batch(
    bootstrap: str, topic: str, partition: int, batch: bytes, *, timeout: float = 30
) -> int:
    """Send ``batch`` to ``topic``/``partition`` (led by the first bootstrap server, as on a
    one-node broker); the base offset the broker gave it. Raises when the broker refuses it."""
    host, _, port = bootstrap.split(",")[0].rpartition(":")
    request = (
        struct.pack(">hhi", 0, 3, 1)  # Produce, version 3, correlation id 1
        + _string("outbox-tests-wire")
        + struct.pack(">hhi", -1, -1, int(timeout * 1000))  # no transactional id; acks=all
        + struct.pack(">i", 1)
        + _string(topic)
        + struct.pack(">i", 1)
        + struct.pack(">ii", partition, len(batch))
        + batch
    )
    with socket.create_connection((host, int(port)), timeout=timeout) as connection:
        connection.sendall(struct.pack(">i", len(request)) + request)
        (size,) = struct.unpack(">i", _exactly(connection, 4))
        answer = _exactly(connection, size)
    # correlation id; [topic: name, [partition, error code, base offset, append time]]; throttle
    position = 4 + 4
    (name_length,) = struct.unpack_from(">h", answer, position)
    position += 2 + name_length + 4
    _, error, base_offset, _ = struct.unpack_from(">ihqq", answer, position)
    if error:
        raise RuntimeError(f"the broker refused the crafted batch: Kafka error code {error}")
    return int(base_offset)


def _exactly(connection: socket.socket, count: int) -> bytes:
    data = bytearray()
    while len(data) < count:
        chunk = connection.recv(count - len(data))
        if not chunk:
            raise ConnectionError("the broker closed the connection")
        data += chunk
    return bytes(data)


# -- contract records around a crafted one -------------------------------------------------


@contextmanager
def own_topic(bootstrap: str, topic: str) -> Iterator[str]:
    """``topic`` made for the test and deleted after it: no later reader of the session (the
    lake's own kafka-python source among them) meets what the test wrote."""
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.create_topics([NewTopic(topic, 1, 1)])
        yield topic
    finally:
        admin.delete_topics([topic])
        admin.close()


def contract_record(aggregate_type: str, n: int) -> ContractRecord:
    return record_for(
        event_id=new_event_id(),
        aggregate_type=aggregate_type,
        aggregate_id="1",
        event_type="Happened",
        payload_text=f'{{"n": {n}}}',
        headers_text="{}",
        traceparent="",
        position=n + 1,
    )


def wire(record: ContractRecord) -> WireRecord:
    return WireRecord(record.key, record.value, [(k.encode(), v) for k, v in record.headers])


def send(bootstrap: str, records: list[ContractRecord]) -> None:
    producer = KafkaProducer(bootstrap_servers=bootstrap)
    try:
        for record in records:
            producer.send(
                record.topic, key=record.key, value=record.value, headers=list(record.headers)
            ).get(timeout=30)
    finally:
        producer.close()


def craft_bad_record(bootstrap: str, aggregate_type: str, around: list[ContractRecord]) -> int:
    """One batch: ``around[0]``, a record whose only fault is one header name that is not
    UTF-8 (its ``id`` header is fine), ``around[1]``. Returns the bad record's offset."""
    bad = contract_record(aggregate_type, 99)
    batch = record_batch(
        [
            wire(around[0]),
            WireRecord(bad.key, bad.value, [*wire(bad).headers, (BAD_NAME, b"x")]),
            wire(around[1]),
        ]
    )
    return produce_batch(bootstrap, topic_for(aggregate_type), 0, batch) + 1
