"""The analysts' side without Spark: SQL over the lake tables with DuckDB, through Arrow.

Every Delta table under the lake root is registered in DuckDB under its own name
(``events``, ``quarantine``, ``aggregate_<type>``), read with ``deltalake`` (DuckDB's own
Delta extension would need a download at run time), from a folder or an object store
(:mod:`outbox_lake.storage`).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from deltalake import DeltaTable

from outbox_lake.settings import LakeSettings
from outbox_lake.storage import open_table, table_names

__all__ = [
    "Freshness",
    "TableInfo",
    "arrow_dataset",
    "display_text",
    "freshness",
    "list_tables",
    "run_sql",
    "table_names",
]


@dataclass(frozen=True)
class TableInfo:
    name: str
    rows: int
    version: int
    last_update: datetime | None


def display_text(value: Any) -> str:
    """A value of a lake row as people read it (never a Python repr): decimals without
    padding zeros, times in ISO 8601, bytes as text with the rest escaped."""
    from decimal import Decimal

    if isinstance(value, Decimal):
        return format(value.normalize(), "f")
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, bytes):
        return value.decode("utf-8", "backslashreplace")
    return str(value)


def _plain(kind: Any) -> Any:
    """Arrow's view types as their plain twins (deltalake 1.6 reads text as ``string_view``,
    which pyarrow's compute kernels cannot compare with a ``string`` literal: DuckDB's
    filters pushed into the dataset failed on any text filter)."""
    import pyarrow as pa

    if kind == pa.string_view() or kind == pa.large_string():
        return pa.string()
    if kind == pa.binary_view() or kind == pa.large_binary():
        return pa.binary()
    return kind


def arrow_dataset(table: DeltaTable) -> Any:
    """The table as a pyarrow dataset of plain Arrow types (``string``, ``binary``)."""
    import pyarrow as pa

    schema = pa.schema(table.schema().to_arrow())
    plain = pa.schema([field.with_type(_plain(field.type)) for field in schema])
    return table.to_pyarrow_dataset(schema=plain)


def _open(settings: LakeSettings, name: str) -> DeltaTable | None:
    return open_table(settings, settings.table_uri(name))


def list_tables(settings: LakeSettings) -> list[TableInfo]:
    tables = []
    for name in table_names(settings):
        table = _open(settings, name)
        if table is None:
            continue
        history = table.history(1)
        stamp = history[0].get("timestamp") if history else None
        rows = int(arrow_dataset(table).count_rows())
        tables.append(
            TableInfo(
                name=name,
                rows=rows,
                version=table.version(),
                last_update=datetime.fromtimestamp(stamp / 1000) if stamp else None,
            )
        )
    return tables


@dataclass(frozen=True)
class Freshness:
    """How far behind Kafka ``events`` is, from its last commit's progress."""

    last_commit: datetime | None
    """When the ingest job last committed (None: it never did)."""
    newest_event: datetime | None
    """The newest event time in ``events`` (from the files' statistics)."""
    behind: int | None
    """Offsets on Kafka the lake has not taken in yet, about as many records (None: Kafka
    did not answer)."""
    partitions_behind: int = 0
    unknown_reason: str | None = None
    """Why ``behind`` is unknown."""


def _newest_event(table: DeltaTable) -> datetime | None:
    import pyarrow as pa
    import pyarrow.compute as pc

    actions = pa.table(table.get_add_actions(flatten=True))  # arro3's table, as pyarrow's
    column = "max.event_time"
    if column not in actions.schema.names or actions.num_rows == 0:
        return None
    newest = pc.max(actions.column(column)).as_py()
    return newest if isinstance(newest, datetime) else None


def _lag(offsets: int) -> int:
    """Offsets not taken in, as records: the lake's progress ends after a partition's last
    record, and a transaction's commit marker (Connect's, the relay's) takes the offset
    after it, so one offset behind is up to date."""
    return offsets if offsets > 1 else 0


def freshness(settings: LakeSettings, kafka: Any) -> Freshness:
    """``events``' last commit, newest event and lag behind Kafka (``kafka``: the cluster's
    :class:`~outbox.settings.KafkaSettings`; a broker that does not answer leaves the lag
    unknown, with the reason, at once: this never waits)."""
    from outbox.core.errors import OutboxError
    from outbox_lake.kafka_metadata import KafkaMetadata
    from outbox_lake.progress import latest_progress
    from outbox_lake.tables import EVENTS_TABLE

    table = _open(settings, EVENTS_TABLE.name)
    if table is None:
        return Freshness(None, None, None, unknown_reason="no events table yet")
    history = table.history(1)
    stamp = history[0].get("timestamp") if history else None
    last_commit = datetime.fromtimestamp(stamp / 1000).astimezone() if stamp else None
    newest = _newest_event(table)
    progress = latest_progress(table)
    read = progress.partitions if progress is not None else {}
    metadata = KafkaMetadata(kafka, settings.topic_pattern, patience_seconds=0)
    try:
        on_kafka = metadata.partitions()
    except OutboxError as error:
        return Freshness(last_commit, newest, None, unknown_reason=str(error))
    finally:
        metadata.close()
    behind = {
        where: _lag(now.latest - (read[where].end_offset if where in read else now.earliest))
        for where, now in on_kafka.items()
    }
    return Freshness(
        last_commit,
        newest,
        sum(behind.values()),
        partitions_behind=sum(1 for lag in behind.values() if lag),
    )


def run_sql(
    settings: LakeSettings, sql: str, params: list[Any] | None = None
) -> tuple[list[str], list[tuple[Any, ...]]]:
    """Run ``sql`` (``?`` placeholders for ``params``) over the lake's tables."""
    import duckdb

    connection = duckdb.connect()
    try:
        for name in table_names(settings):
            table = _open(settings, name)
            if table is not None:
                connection.register(name, arrow_dataset(table))
        result = connection.execute(sql, params)
        columns = [column[0] for column in result.description or []]
        return columns, result.fetchall()
    finally:
        connection.close()
