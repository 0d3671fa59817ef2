"""From a Kafka record to a lake row, or to quarantine with a reason: the Python contract.
(Pure: no Spark, no I/O.)

The JVM decides every record the delivery paths write (:mod:`outbox_lake.spark_contract`);
Spark runs :func:`parse_batch` on its executors (``mapInArrow``) over the records it left
undecided, and only those: each becomes an event row or a quarantine row with its reason
and its quarantine id, by :func:`outbox.core.contract.parse_record`, the one definition of
the contract.
"""

from __future__ import annotations

import contextlib
import hashlib
import sys
import uuid
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from typing import Any

from outbox.core.contract import ContractViolation, event_id_of, parse_record
from outbox.core.text import MAX_REASON_CHARS, storable_text

__all__ = [
    "EVENT_COLUMNS",
    "FALLBACK_SCHEMA",
    "RAW_COLUMNS",
    "event_time_of",
    "parse_batch",
    "parse_one",
    "parsed_arrow_schema",
    "parsed_record_batch",
    "record_quarantine_id",
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
    "position",
    "event_time",
    "event_date",
    "topic",
    "partition",
    "offset",
)

FALLBACK_SCHEMA = (
    "kind string, event_id string, aggregate_type string, aggregate_id string, "
    "event_type string, payload string, headers string, traceparent string, position long, "
    "event_time timestamp, event_date date, topic string, partition int, offset long, "
    "raw_key binary, raw_value binary, reason string, quarantine_id string"
)
"""What :func:`parse_batch` gives for each record (``headers``: the event's JSON text)."""


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def event_time_of(event_id: uuid.UUID) -> datetime:
    """A UUIDv7 carries its creation time (ms) in its first 48 bits; other versions, and a
    time no calendar date can hold: the epoch."""
    if event_id.version != 7:
        return _EPOCH
    try:
        return datetime.fromtimestamp((event_id.int >> 80) / 1000, tz=UTC)
    except (OverflowError, ValueError, OSError):
        return _EPOCH


def parse_one(
    topic: str,
    partition: int,
    offset: int,
    key: bytes | None,
    value: bytes | None,
    headers: Sequence[tuple[str, bytes | None]],
) -> dict[str, Any]:
    """One parsed row: ``kind`` is ``event`` or ``quarantine`` (with the ``reason``).

    Never raises: whatever the bytes, the record becomes one row or the other. ``payload``
    and ``headers`` are the record's own JSON text, exactly as committed (an integer beyond
    64 bits or a number beyond a double's range stays exact there).
    """
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
        if event.payload_text is None:
            return {**row, "kind": "quarantine", "reason": "the record has no value (tombstone)"}
        event_time = event_time_of(event.event_id)
        return {
            **row,
            "kind": "event",
            "event_id": str(event.event_id),
            "aggregate_type": event.aggregate_type,
            "aggregate_id": event.aggregate_id,
            "event_type": event.event_type,
            "payload": event.payload_text,
            "headers": event.headers_text,
            "traceparent": event.traceparent,
            "position": event.position,
            "event_time": event_time,
            "event_date": event_time.date(),
        }
    except ContractViolation as violation:
        reason = str(violation)
    except Exception as error:  # a record must never stop the stream
        reason = f"{type(error).__name__}: {error}"
    return {
        **row,
        "kind": "quarantine",
        "reason": storable_text(reason, max_chars=MAX_REASON_CHARS),  # Arrow's strings: UTF-8
        "event_id": _event_id_or_none(headers),
    }


def _event_id_or_none(headers: Sequence[tuple[str, bytes | None]]) -> str | None:
    """The record's event id when its ``id`` header holds one (to find it in quarantine)."""
    try:
        return str(event_id_of(headers))
    except Exception:
        return None


def parsed_arrow_schema() -> Any:
    """:data:`FALLBACK_SCHEMA` as an Arrow schema."""
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
            ("position", pa.int64()),
            ("event_time", pa.timestamp("us", tz="UTC")),
            ("event_date", pa.date32()),
            ("topic", pa.string()),
            ("partition", pa.int32()),
            ("offset", pa.int64()),
            ("raw_key", pa.binary()),
            ("raw_value", pa.binary()),
            ("reason", pa.string()),
            ("quarantine_id", pa.string()),
        ]
    )


def record_quarantine_id(
    topic: str, partition: int, offset: int, key: bytes | None, value: bytes | None
) -> str:
    """The same whenever the same record is set aside again (its coordinates and bytes)."""
    digest = hashlib.sha256()
    for part in (key, value):
        digest.update(b"-" if part is None else b"+%d:" % len(part) + part)
    return f"{topic}:{partition}:{offset}:{digest.hexdigest()[:32]}"


def parse_raw(record: dict[str, Any]) -> dict[str, Any]:
    """One row of Spark's Kafka source (``key``, ``value``, ``topic``, ``partition``,
    ``offset``, ``timestamp``, ``headers``) as a parsed row with (when set aside) its
    quarantine id. Never raises."""
    headers = [(h["key"], h["value"]) for h in (record["headers"] or [])]
    topic, partition, offset = record["topic"], record["partition"], record["offset"]
    key, value = record["key"], record["value"]
    row = parse_one(topic, partition, offset, key, value, headers)
    if row["kind"] != "event":
        row["quarantine_id"] = record_quarantine_id(topic, partition, offset, key, value)
    return row


def _depth() -> int:
    """How many frames the caller's stack holds (cheap: no source lookups)."""
    frame, depth = sys._getframe(), 0
    while frame is not None:
        frame, depth = frame.f_back, depth + 1  # type: ignore[assignment]
    return depth


@contextlib.contextmanager
def recursion_limit(limit: int) -> Iterator[None]:
    """Python's recursion limit set to ``limit`` for a while: how deeply nested a JSON text
    the parser reads, whatever the depth of the worker's stack it runs in."""
    before = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, _depth() + 50))
    try:
        yield
    finally:
        sys.setrecursionlimit(before)


PARSE_RECURSION_LIMIT = 4000
"""A record's JSON is read up to about this depth (deeper: quarantine, "nested too deeply")."""
TYPING_RECURSION_LIMIT = 1000
"""A payload is typed up to about this depth (deeper: its typed row is set aside)."""


def parse_batch(batches: Iterator[Any]) -> Iterator[Any]:
    """``mapInArrow`` body: raw Kafka record batches in, parsed record batches out."""
    for batch in batches:
        with recursion_limit(PARSE_RECURSION_LIMIT):
            rows = [parse_raw(record) for record in batch.to_pylist()]
        yield parsed_record_batch(rows)


def parsed_record_batch(rows: list[dict[str, Any]]) -> Any:
    """Parsed rows as one Arrow record batch; a row Arrow refuses goes to quarantine alone."""
    import pyarrow as pa

    schema = parsed_arrow_schema()
    try:
        return pa.RecordBatch.from_pylist(rows, schema=schema)
    except (pa.ArrowException, ValueError, TypeError, OverflowError):
        return pa.RecordBatch.from_pylist([_arrow_safe(row, schema) for row in rows], schema)


def _arrow_safe(row: dict[str, Any], schema: Any) -> dict[str, Any]:
    """The row if Arrow can hold it, else the record as quarantine with the reason."""
    import pyarrow as pa

    try:
        pa.RecordBatch.from_pylist([row], schema=schema)
        return row
    except (pa.ArrowException, ValueError, TypeError, OverflowError) as error:
        keep = ("topic", "partition", "offset", "raw_key", "raw_value", "event_id")
        kept = {name: row.get(name) for name in keep}
        return {
            **kept,
            "kind": "quarantine",
            "reason": storable_text(
                f"the record cannot be stored: {type(error).__name__}: {error}",
                max_chars=MAX_REASON_CHARS,
            ),
            "quarantine_id": record_quarantine_id(
                row["topic"], row["partition"], row["offset"], row["raw_key"], row["raw_value"]
            ),
        }
