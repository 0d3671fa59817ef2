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

__all__ = ["TableInfo", "arrow_dataset", "list_tables", "run_sql", "table_names"]


@dataclass(frozen=True)
class TableInfo:
    name: str
    rows: int
    version: int
    last_update: datetime | None


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
