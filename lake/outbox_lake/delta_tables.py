"""The one way the sink writes a Delta table: create it, or insert-only merge into it.

Insert-only on a key (the event id, or the quarantine id): a row whose key is already in
the table is left alone, so writing the same rows twice, from a replay, a second path or a
re-read after a checkpoint reset, adds nothing. Where the table is partitioned by
``event_date`` the merge is restricted to the days of the rows written (UUIDv7 event ids
carry their day), and to the range of event ids written (UUIDv7 ids grow with time, so the
files of a day hold narrow ranges and the merge skips all but the newest): its cost follows
the batch, not the table nor the day. (Measured: 10,000 rows into a day of 2,000,000 rows
in 40 files, 0.3 to 1.2 s without the range, 0.03 to 0.05 s with it.)
"""

from __future__ import annotations

import re
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from deltalake.exceptions import TableNotFoundError

__all__ = ["columns_of", "insert_new_rows", "open_table"]

_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def open_table(uri: str) -> DeltaTable | None:
    try:
        return DeltaTable(uri)
    except TableNotFoundError:
        return None


def columns_of(table: DeltaTable) -> dict[str, pa.DataType]:
    # deltalake answers with arro3 types: through the C interface into pyarrow's.
    return {field.name: field.type for field in pa.schema(table.schema().to_arrow())}


def insert_new_rows(
    uri: str,
    table: DeltaTable | None,
    rows: pa.Table,
    *,
    key: str,
    transactions: list[Transaction],
    by_day: bool,
    owner: str | None = None,
) -> int:
    """Create the table with ``rows``, or add those of ``rows`` whose ``key`` it lacks;
    return how many rows were added.

    New columns of ``rows`` are added to the table (additive schema evolution). ``owner``
    names what the table holds (its Delta metadata name): set when it is created.
    """
    commit = CommitProperties(app_transactions=transactions or None)
    if table is None:
        write_deltalake(
            uri,
            rows,
            partition_by=["event_date"] if by_day else None,
            name=owner,
            commit_properties=commit,
        )
        return int(rows.num_rows)
    predicate = f"t.{key} = s.{key}"
    if key == "event_id":
        bounds = pc.min_max(rows.column(key))
        low, high = bounds["min"].as_py(), bounds["max"].as_py()
        if _UUID.fullmatch(str(low)) and _UUID.fullmatch(str(high)):  # safe literals only
            predicate = f"t.{key} >= '{low}' AND t.{key} <= '{high}' AND {predicate}"
    if by_day:
        days = sorted({day.isoformat() for day in rows.column("event_date").to_pylist()})
        in_days = ", ".join(f"'{day}'" for day in days)  # ISO dates from Arrow: safe literals
        predicate = f"t.event_date IN ({in_days}) AND t.event_date = s.event_date AND {predicate}"
    merger: Any = table.merge(
        rows,
        predicate=predicate,
        source_alias="s",
        target_alias="t",
        merge_schema=True,
        commit_properties=commit,
    )
    outcome = merger.when_not_matched_insert_all().execute()
    return int(outcome.get("num_target_rows_inserted", 0))
