"""The lake's sink: one micro-batch into the Delta tables, exactly once, with ``deltalake``.

For each micro-batch (``foreachBatch(df, batch_id)``):

1. Spark parses and validates every record on the executors (``mapInArrow`` with
   :func:`lake.records.parse_batch`) and drops duplicate event ids within the batch;
2. the driver receives the parsed rows of that one batch (bounded by the source's admission
   control, so its memory stays bounded whatever the backlog);
3. each table gets one Delta commit carrying an *application transaction* ``(app id, batch
   id)``: a batch replayed after a crash is recognised (``transaction_version``) and skipped
   table by table, so a crash between two tables' commits finishes the missing ones only;
4. ``events`` and the typed tables are written with an insert-only merge on ``event_id``,
   restricted to the day partitions of the batch (UUIDv7 ids carry their creation time), so a
   duplicate arriving days later, through any path, adds no row and the merge touches only
   the partitions the batch's events belong to.

Tables: ``events``, ``quarantine``, and ``aggregate_<type>`` for each aggregate type (the
payload's top-level fields as columns, new fields added as columns; a field whose type
changes incompatibly sends that event to quarantine with the reason).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterable
from typing import Any

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from deltalake.exceptions import CommitFailedError, TableNotFoundError

from lake.records import EVENT_COLUMNS, parsed_arrow_schema
from lake.settings import LakeSettings

__all__ = ["EVENTS", "QUARANTINE", "DeltaSink", "typed_table_name"]

log = logging.getLogger("outbox.lake.sink")

EVENTS = "events"
QUARANTINE = "quarantine"
_TYPED_PREFIX = "aggregate_"
_COMMIT_ATTEMPTS = 5

_PARSED = parsed_arrow_schema()
_INGEST_TIME = pa.field("ingest_time", pa.timestamp("us", tz="UTC"))
EVENTS_SCHEMA = pa.schema([*(_PARSED.field(name) for name in EVENT_COLUMNS), _INGEST_TIME])
QUARANTINE_SCHEMA = pa.schema(
    [
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("event_id", pa.string()),
        ("reason", pa.string()),
        ("ingest_time", pa.timestamp("us", tz="UTC")),
    ]
)
_TYPED_BASE = [
    ("event_id", pa.string()),
    ("aggregate_id", pa.string()),
    ("event_type", pa.string()),
    ("event_time", pa.timestamp("us", tz="UTC")),
    ("event_date", pa.date32()),
]
_RESERVED = {name for name, _ in _TYPED_BASE}


def typed_table_name(aggregate_type: str) -> str:
    """``aggregate_<type>``, the type reduced to lowercase letters, digits and underscores."""
    return _TYPED_PREFIX + re.sub(r"[^a-z0-9_]", "_", aggregate_type.lower())


def _scalar_type(value: Any) -> pa.DataType | None:
    """The column type of a top-level payload value (objects and arrays are kept as JSON)."""
    if value is None:
        return None
    if isinstance(value, bool):
        return pa.bool_()
    if isinstance(value, int):
        return pa.int64()
    if isinstance(value, float):
        return pa.float64()
    return pa.string()


def _cell(value: Any) -> Any:
    if isinstance(value, dict | list):
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    return value


def _compatible(new: pa.DataType, existing: pa.DataType) -> bool:
    return bool(new == existing or (pa.types.is_integer(new) and pa.types.is_floating(existing)))


def parsed_frame(frame: Any) -> Any:
    """Raw Kafka rows parsed on the executors (``kind``: event or quarantine), stamped with
    their ingest time."""
    from pyspark.sql import functions as f

    from lake.records import PARSED_SCHEMA, parse_batch

    return frame.mapInArrow(parse_batch, PARSED_SCHEMA).withColumn(
        "ingest_time", f.current_timestamp()
    )


class DeltaSink:
    """Writes parsed micro-batches to the lake tables; idempotent per (query, batch id)."""

    def __init__(self, settings: LakeSettings) -> None:
        self.settings = settings

    def _app_id(self, table: str) -> str:
        return f"{self.settings.query_name}:{table}"

    def _table(self, name: str) -> DeltaTable | None:
        try:
            return DeltaTable(self.settings.table_uri(name))
        except TableNotFoundError:
            return None

    def _already_committed(self, table: DeltaTable | None, name: str, batch_id: int) -> bool:
        if table is None:
            return False
        version = table.transaction_version(self._app_id(name))
        return version is not None and int(version) >= batch_id

    def _commit(self, name: str, batch_id: int) -> CommitProperties:
        return CommitProperties(app_transactions=[Transaction(self._app_id(name), batch_id)])

    # -- the batch -------------------------------------------------------------------------

    def write_spark_batch(self, frame: Any, batch_id: int) -> None:
        """``foreachBatch`` body: parse and dedup in Spark, then :meth:`write`."""
        # Persisted: Kafka is read and parsed once per batch, not once per output.
        parsed = parsed_frame(frame).persist()
        try:
            events = parsed.where("kind = 'event'").dropDuplicates(["event_id"]).toArrow()
            quarantined = parsed.where("kind = 'quarantine'").toArrow()
        finally:
            parsed.unpersist()
        self.write(
            batch_id,
            events=events if events.num_rows else None,
            quarantined=quarantined if quarantined.num_rows else None,
        )

    def write(
        self, batch_id: int, *, events: pa.Table | None, quarantined: pa.Table | None
    ) -> None:
        """Commit one parsed batch to every table it concerns (each at most once).

        A commit that loses a race (``outbox lake maintain`` compacting the same table) is
        retried: each table's application transaction makes the retry skip what landed.
        """
        for attempt in range(1, _COMMIT_ATTEMPTS + 1):
            try:
                self._write_once(batch_id, events=events, quarantined=quarantined)
                return
            except CommitFailedError as conflict:
                if attempt == _COMMIT_ATTEMPTS:
                    raise
                log.warning("batch %d: commit conflict, retrying: %s", batch_id, conflict)

    def _write_once(
        self, batch_id: int, *, events: pa.Table | None, quarantined: pa.Table | None
    ) -> None:
        extra_quarantine: list[dict[str, Any]] = []
        if events is not None and events.num_rows:
            events = events.sort_by(
                [("topic", "ascending"), ("partition", "ascending"), ("offset", "ascending")]
            )
            for aggregate_type, rows in self._by_type(events).items():
                extra_quarantine += self._write_typed(aggregate_type, rows, batch_id)
            self._write_events(events, batch_id)
        rows = [] if quarantined is None else quarantined.to_pylist()
        self._write_quarantine(rows, extra_quarantine, batch_id)

    @staticmethod
    def _by_type(events: pa.Table) -> dict[str, list[dict[str, Any]]]:
        grouped: dict[str, list[dict[str, Any]]] = {}
        for row in events.to_pylist():
            grouped.setdefault(row["aggregate_type"], []).append(row)
        return grouped

    def _merge_insert_only(
        self, name: str, table: DeltaTable, source: pa.Table, batch_id: int, *, merge_schema: bool
    ) -> None:
        days = sorted({day.isoformat() for day in source.column("event_date").to_pylist()})
        in_days = ", ".join(f"'{day}'" for day in days)  # ISO dates from Arrow: safe literals
        (
            table.merge(
                source,
                predicate=(
                    f"t.event_date IN ({in_days}) AND t.event_date = s.event_date "
                    "AND t.event_id = s.event_id"
                ),
                source_alias="s",
                target_alias="t",
                merge_schema=merge_schema,
                commit_properties=self._commit(name, batch_id),
            )
            .when_not_matched_insert_all()
            .execute()
        )

    def _write_events(self, events: pa.Table, batch_id: int) -> None:
        table = self._table(EVENTS)
        if self._already_committed(table, EVENTS, batch_id):
            return
        source = events.select(EVENTS_SCHEMA.names).cast(EVENTS_SCHEMA)
        if table is None:
            write_deltalake(
                self.settings.table_uri(EVENTS),
                source,
                partition_by=["event_date"],
                commit_properties=self._commit(EVENTS, batch_id),
            )
            return
        self._merge_insert_only(EVENTS, table, source, batch_id, merge_schema=False)

    def _write_typed(
        self, aggregate_type: str, rows: list[dict[str, Any]], batch_id: int
    ) -> list[dict[str, Any]]:
        """Write the typed rows; return the rows that go to quarantine instead."""
        name = typed_table_name(aggregate_type)
        table = self._table(name)
        if self._already_committed(table, name, batch_id):
            return []
        existing: dict[str, pa.DataType] = {}
        if table is not None:
            # deltalake answers with arro3 types: through the C interface into pyarrow's.
            existing = {field.name: field.type for field in pa.schema(table.schema().to_arrow())}
        columns: dict[str, pa.DataType] = {}
        accepted: list[dict[str, Any]] = []
        rejected: list[dict[str, Any]] = []
        for row in rows:
            payload = json.loads(row["payload"])
            if not isinstance(payload, dict):
                rejected.append({**row, "reason": "the payload is not a JSON object"})
                continue
            problem = None
            types: dict[str, pa.DataType] = {}
            for field_name, value in payload.items():
                column_type = _scalar_type(value)
                if column_type is None:
                    continue
                if field_name in _RESERVED:
                    problem = f"payload field {field_name!r} clashes with a lake column"
                    break
                known = existing.get(field_name) or columns.get(field_name)
                if known is not None and not _compatible(column_type, known):
                    problem = (
                        f"payload field {field_name!r} is {column_type} here but {known} in {name}"
                    )
                    break
                types[field_name] = known or column_type
            if problem is not None:
                rejected.append({**row, "reason": problem})
                continue
            columns.update({k: v for k, v in types.items() if k not in columns})
            accepted.append({**row, "_payload": payload})
        for row in rejected:
            log.warning("event %s to quarantine: %s", row["event_id"], row["reason"])
        if not accepted:
            return rejected
        schema = pa.schema(
            _TYPED_BASE
            + [(field, existing.get(field, kind)) for field, kind in sorted(columns.items())]
        )
        source = pa.Table.from_pylist(
            [
                {
                    **{base: row[base] for base, _ in _TYPED_BASE},
                    **{k: _cell(v) for k, v in row["_payload"].items() if k in columns},
                }
                for row in accepted
            ],
            schema=schema,
        )
        if table is None:
            write_deltalake(
                self.settings.table_uri(name),
                source,
                partition_by=["event_date"],
                commit_properties=self._commit(name, batch_id),
            )
        else:
            self._merge_insert_only(name, table, source, batch_id, merge_schema=True)
        return rejected

    def _write_quarantine(
        self,
        parsed: Iterable[dict[str, Any]],
        rejected_events: list[dict[str, Any]],
        batch_id: int,
    ) -> None:
        rows = [
            {
                "topic": row["topic"],
                "partition": row["partition"],
                "offset": row["offset"],
                "key": row.get("raw_key"),
                "value": row.get("raw_value"),
                "event_id": row.get("event_id"),
                "reason": row["reason"],
                "ingest_time": row.get("ingest_time"),
            }
            for row in [*parsed, *rejected_events]
        ]
        if not rows:
            return
        table = self._table(QUARANTINE)
        if self._already_committed(table, QUARANTINE, batch_id):
            return
        source = pa.Table.from_pylist(rows, schema=QUARANTINE_SCHEMA)
        if table is None:
            write_deltalake(
                self.settings.table_uri(QUARANTINE),
                source,
                commit_properties=self._commit(QUARANTINE, batch_id),
            )
            return
        (
            table.merge(
                source,
                predicate=(
                    "t.topic = s.topic AND t.partition = s.partition AND t.offset = s.offset"
                ),
                source_alias="s",
                target_alias="t",
                commit_properties=self._commit(QUARANTINE, batch_id),
            )
            .when_not_matched_insert_all()
            .execute()
        )
