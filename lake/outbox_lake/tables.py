"""The lake's tables, each column defined once: the Spark schemas, the readers' Arrow schemas
and the analysts' docs table (docs/analysts.md) are all derived from here.

A column's ``kind`` is one of a few logical types that both Spark (Delta's Spark writer) and
``deltalake``/DuckDB (the readers) hold the same way: ``string``, ``long``, ``int``,
``double``, ``boolean``, ``binary``, ``date`` and ``timestamp`` (microseconds, UTC: Spark's
``timestamp``, Arrow's ``timestamp[us, tz=UTC]``). No ``timestamp_ntz`` nor ``variant``: each
needs a Delta table feature that the readers (delta-rs 1.6) need not support.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

__all__ = [
    "EVENTS",
    "EVENTS_TABLE",
    "PROGRESS",
    "QUARANTINE",
    "QUARANTINE_TABLE",
    "TYPED_BASE",
    "TYPED_PREFIX",
    "Column",
    "Kind",
    "Table",
    "arrow_type",
    "docs_table",
    "spark_type",
]

Kind = Literal["string", "long", "int", "double", "boolean", "binary", "date", "timestamp"]

EVENTS = "events"
QUARANTINE = "quarantine"
PROGRESS = "_progress"
"""Where an earlier release kept the lake's progress (:mod:`outbox_lake.upgrade` reads it)."""
TYPED_PREFIX = "aggregate_"


@dataclass(frozen=True)
class Column:
    name: str
    kind: Kind
    doc: str


@dataclass(frozen=True)
class Table:
    name: str
    one_row_per: str
    columns: tuple[Column, ...]
    key: str
    """The column a row is known by: an append keeps only the keys the table lacks."""
    by_day: bool
    """Partitioned by ``event_date`` (the dedup's reads are restricted to the batch's days)."""

    @property
    def names(self) -> list[str]:
        return [column.name for column in self.columns]

    def arrow_schema(self) -> Any:
        import pyarrow as pa

        return pa.schema([(c.name, arrow_type(c.kind)) for c in self.columns])

    def spark_ddl(self) -> str:
        """The columns as a Spark DDL string (``name type, ...``)."""
        return ", ".join(f"`{c.name}` {spark_type(c.kind)}" for c in self.columns)


_ARROW = {
    "string": "string",
    "long": "int64",
    "int": "int32",
    "double": "float64",
    "boolean": "bool_",
    "binary": "binary",
    "date": "date32",
}
_SPARK = {
    "string": "string",
    "long": "bigint",
    "int": "int",
    "double": "double",
    "boolean": "boolean",
    "binary": "binary",
    "date": "date",
    "timestamp": "timestamp",
}


def arrow_type(kind: Kind) -> Any:
    import pyarrow as pa

    if kind == "timestamp":
        return pa.timestamp("us", tz="UTC")
    return getattr(pa, _ARROW[kind])()


def spark_type(kind: Kind) -> str:
    return _SPARK[kind]


_EVENT_ID = Column("event_id", "string", "UUIDv7 text")
_AGGREGATE = (
    Column("aggregate_type", "string", "the aggregate type the event belongs to"),
    Column("aggregate_id", "string", "the aggregate's id (the Kafka key)"),
    Column("event_type", "string", "e.g. `OrderPlaced`"),
)
_POSITION = Column("position", "long", "commit order within the aggregate")
_TIMES = (
    Column(
        "event_time",
        "timestamp",
        "when the application *built* the event: it is in the UUIDv7 id",
    ),
    Column("event_date", "date", "partition column (the day of `event_time`)"),
)
_WHERE = (
    Column("topic", "string", "where it was read"),
    Column("partition", "int", "where it was read"),
    Column("offset", "long", "where it was read"),
)
_INGEST_TIME = Column("ingest_time", "timestamp", "when the lake took it in")

EVENTS_TABLE = Table(
    EVENTS,
    "event, ever",
    (
        _EVENT_ID,
        *_AGGREGATE,
        Column("payload", "string", "the JSON text exactly as committed"),
        Column("headers", "string", "JSON text"),
        Column("traceparent", "string", "W3C trace context, when the writer had one"),
        _POSITION,
        *_TIMES,
        *_WHERE,
        _INGEST_TIME,
    ),
    key="event_id",
    by_day=True,
)

TYPED_BASE = (_EVENT_ID, *_AGGREGATE, _POSITION, *_TIMES)
"""The columns every ``aggregate_<type>`` table starts with; one column per top-level payload
field follows (objects and arrays as JSON text)."""

QUARANTINE_TABLE = Table(
    QUARANTINE,
    "record, or typed row, that could not be used",
    (
        Column("quarantine_id", "string", "the same whenever the same record is set aside"),
        Column(
            "target_table",
            "string",
            "`events` for a record that is not a usable event; `aggregate_<type>` for an "
            "event whose typed row was set aside",
        ),
        *_WHERE,
        Column("key", "binary", "the record's raw key"),
        Column("value", "binary", "the record's raw value"),
        Column("event_id", "string", "when known"),
        Column("reason", "string", "why it was set aside"),
        _INGEST_TIME,
    ),
    key="quarantine_id",
    by_day=False,
)


def docs_table() -> str:
    """The analysts' Markdown table of the lake's tables (docs/analysts.md)."""
    typed = ", ".join(f"`{c.name}`" for c in TYPED_BASE)
    lines = ["| table | one row per | columns |", "| --- | --- | --- |"]
    for table in (EVENTS_TABLE, QUARANTINE_TABLE):
        cells = ", ".join(f"`{c.name}` ({c.doc})" for c in table.columns)
        lines.append(f"| `{table.name}` | {table.one_row_per} | {cells} |")
    lines.insert(
        3,
        f"| `{TYPED_PREFIX}<type>` | event of that aggregate type | {typed}, and one column "
        "per top-level payload field (objects and arrays as JSON text) |",
    )
    return "\n".join(lines)
