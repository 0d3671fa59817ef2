"""From a Kafka record to a lake row, or to quarantine with a reason. (Pure: no Spark, no I/O.)

Spark runs :func:`parse_batch` on its executors (``mapInArrow``), so parsing and validation
happen in parallel; the driver only sees the parsed rows of one bounded micro-batch.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

from outbox.core.contract import ContractViolation, parse_record

__all__ = [
    "EVENT_COLUMNS",
    "RAW_COLUMNS",
    "event_time_of",
    "parse_batch",
    "parse_one",
    "parsed_arrow_schema",
]

# The raw schema: the same columns as Spark's own Kafka source, so either can feed the job.
RAW_COLUMNS = (
    "key binary, value binary, topic string, partition int, offset long, timestamp timestamp, "
    "headers array<struct<key:string,value:binary>>"
)

EVENT_COLUMNS = (
    "event_id",
    "aggregate_type",
    "aggregate_id",
    "event_type",
    "payload",
    "headers",
    "traceparent",
    "event_time",
    "event_date",
    "topic",
    "partition",
    "offset",
)

PARSED_SCHEMA = (
    "kind string, event_id string, aggregate_type string, aggregate_id string, "
    "event_type string, payload string, headers string, traceparent string, "
    "event_time timestamp, event_date date, topic string, partition int, offset long, "
    "raw_key binary, raw_value binary, reason string"
)


def event_time_of(event_id: uuid.UUID) -> datetime:
    """A UUIDv7 carries its creation time (ms) in its first 48 bits; other versions: epoch."""
    if event_id.version != 7:
        return datetime(1970, 1, 1, tzinfo=UTC)
    return datetime.fromtimestamp((event_id.int >> 80) / 1000, tz=UTC)


def parse_one(
    topic: str,
    partition: int,
    offset: int,
    key: bytes | None,
    value: bytes | None,
    headers: Sequence[tuple[str, bytes | None]],
) -> dict[str, Any]:
    """One parsed row: ``kind`` is ``event`` or ``quarantine`` (with the ``reason``)."""
    row: dict[str, Any] = {
        "topic": topic,
        "partition": partition,
        "offset": offset,
        "raw_key": key,
        "raw_value": value,
    }
    try:
        event = parse_record(
            topic=topic, partition=partition, offset=offset, key=key, value=value, headers=headers
        )
    except ContractViolation as violation:
        return {**row, "kind": "quarantine", "reason": str(violation)}
    if event.payload is None:
        return {**row, "kind": "quarantine", "reason": "the record has no value (tombstone)"}
    event_time = event_time_of(event.event_id)
    return {
        **row,
        "kind": "event",
        "event_id": str(event.event_id),
        "aggregate_type": event.aggregate_type,
        "aggregate_id": event.aggregate_id,
        "event_type": event.event_type,
        "payload": json.dumps(event.payload, ensure_ascii=False, separators=(",", ":")),
        "headers": json.dumps(event.headers, ensure_ascii=False, separators=(",", ":")),
        "traceparent": event.traceparent,
        "event_time": event_time,
        "event_date": event_time.date(),
    }


def parsed_arrow_schema() -> Any:
    """:data:`PARSED_SCHEMA` as an Arrow schema (the lake tables take their columns from it)."""
    import pyarrow as pa

    return pa.schema(
        [
            ("kind", pa.string()),
            ("event_id", pa.string()),
            ("aggregate_type", pa.string()),
            ("aggregate_id", pa.string()),
            ("event_type", pa.string()),
            ("payload", pa.string()),
            ("headers", pa.string()),
            ("traceparent", pa.string()),
            ("event_time", pa.timestamp("us", tz="UTC")),
            ("event_date", pa.date32()),
            ("topic", pa.string()),
            ("partition", pa.int32()),
            ("offset", pa.int64()),
            ("raw_key", pa.binary()),
            ("raw_value", pa.binary()),
            ("reason", pa.string()),
        ]
    )


def parse_batch(batches: Iterable[Any]) -> Iterable[Any]:
    """``mapInArrow`` body: raw Kafka record batches in, parsed record batches out."""
    import pyarrow as pa

    schema = parsed_arrow_schema()
    for batch in batches:
        rows = []
        for record in batch.to_pylist():
            headers = [(h["key"], h["value"]) for h in (record["headers"] or [])]
            rows.append(
                parse_one(
                    record["topic"],
                    record["partition"],
                    record["offset"],
                    record["key"],
                    record["value"],
                    headers,
                )
            )
        yield pa.RecordBatch.from_pylist(rows, schema=schema)
