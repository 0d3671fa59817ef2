"""SQL text for every statement the SDK runs. Builds statements; never runs them.

Templates use psycopg's ``%(name)s`` parameters; :func:`to_named_style` gives the ``:name``
form SQLAlchemy's ``text()`` takes. A batch of any size is one statement: a VALUES list for
small batches, arrays taken apart by ``unnest`` for large ones.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property, lru_cache
from typing import Any

from outbox.core.tables import OutboxTables

__all__ = [
    "MAX_VALUES_ROWS",
    "EventRow",
    "OutboxStatements",
    "Result",
    "Statement",
    "batch_parameters",
    "to_named_style",
]

_PYFORMAT_PARAMETER = re.compile(r"%\((\w+)\)s")


def to_named_style(sql: str) -> str:
    """Turn ``%(name)s`` parameters into ``:name`` ones."""
    return _PYFORMAT_PARAMETER.sub(r":\1", sql)


class Result(enum.Enum):
    """What the caller of a statement wants back from it."""

    NOTHING = "nothing"  # not even to wait for it, where the connection allows (pipelines)
    ROWS = "rows"
    ROWCOUNT = "rowcount"  # one row of one value: how many rows the statement touched


@dataclass(frozen=True, slots=True)
class Statement:
    """One statement to run: its text (pyformat), parameters, and what to send back."""

    sql: str
    params: dict[str, Any]
    result: Result


_COLUMNS = ("id", "aggregatetype", "aggregateid", "type", "payload", "headers", "traceparent")
_TYPES = ("uuid", "text", "text", "text", "jsonb", "jsonb", "text")
_COLUMN_LIST = ", ".join(_COLUMNS)
# Up to this many rows a batch is a VALUES list (cheapest to bind and plan); above it, one row
# of arrays taken apart by unnest (7 or 8 parameters whatever the size, so no limit applies).
MAX_VALUES_ROWS = 64


@dataclass(frozen=True, slots=True)
class EventRow:
    """One outbox row as bound into SQL: payload and headers already JSON text."""

    event_id: Any
    aggregate_type: str
    aggregate_id: str
    event_type: str
    payload: str
    headers: str
    traceparent: str | None
    dedup_key: str | None

    def values(self) -> tuple[Any, ...]:
        return (
            self.event_id,
            self.aggregate_type,
            self.aggregate_id,
            self.event_type,
            self.payload,
            self.headers,
            self.traceparent,
        )


@lru_cache(maxsize=256)
def _values_list(count: int, *, with_dedup: bool, cast: bool) -> str:
    columns = (*_COLUMNS, "dedup_key") if with_dedup else _COLUMNS
    types = (*_TYPES, "text") if with_dedup else _TYPES
    rows = []
    for index in range(count):
        cells = [
            f"CAST(%({column}_{index})s AS {type_})" if cast else f"%({column}_{index})s"
            for column, type_ in zip(columns, types, strict=True)
        ]
        if with_dedup:
            cells.append(str(index))
        rows.append(f"({', '.join(cells)})")
    return "VALUES " + ",\n       ".join(rows)


def _unnest(*, with_dedup: bool) -> str:
    columns = (*_COLUMNS, "dedup_key") if with_dedup else _COLUMNS
    types = (*_TYPES, "text") if with_dedup else _TYPES
    arrays = ", ".join(
        f"CAST(%({column}s)s AS {type_}[])" for column, type_ in zip(columns, types, strict=True)
    )
    return f"SELECT * FROM unnest({arrays}) WITH ORDINALITY"


def batch_parameters(rows: Sequence[EventRow], *, with_dedup: bool) -> dict[str, Any]:
    """Parameters for :meth:`OutboxStatements.insert_events` with these rows."""
    columns = (*_COLUMNS, "dedup_key") if with_dedup else _COLUMNS
    if len(rows) > MAX_VALUES_ROWS:
        cells = [(*row.values(), row.dedup_key) if with_dedup else row.values() for row in rows]
        return {
            f"{column}s": list(values)
            for column, values in zip(columns, zip(*cells, strict=True), strict=True)
        }
    params: dict[str, Any] = {}
    for index, row in enumerate(rows):
        values = (*row.values(), row.dedup_key) if with_dedup else row.values()
        for column, value in zip(columns, values, strict=True):
            params[f"{column}_{index}"] = value
    return params


@dataclass(frozen=True)
class OutboxStatements:
    """All SQL of the SDK for one set of table names."""

    tables: OutboxTables

    def insert_events(self, count: int) -> str:
        """Insert ``count`` rows with no dedup keys, in order. The table's trigger assigns
        positions (see the migration)."""
        return self._insert_events(count)

    @lru_cache(maxsize=256)  # noqa: B019 - a handful of instances, kept for the process
    def _insert_events(self, count: int) -> str:
        target = f"INSERT INTO {self.tables.qualified_outbox} ({_COLUMN_LIST})\n"
        if count > MAX_VALUES_ROWS:
            return (
                f"{target}SELECT {_COLUMN_LIST} FROM ({_unnest(with_dedup=False)})"
                f" AS batch({_COLUMN_LIST}, ord) ORDER BY ord"
            )
        return target + _values_list(count, with_dedup=False, cast=False)

    def insert_events_with_dedup(self, count: int) -> str:
        """Insert ``count`` rows, skipping those whose dedup key is live; return inserted ids.

        A key is live while its row is younger than the window. An expired key is taken over
        by the new event. Two transactions with one key: the second waits on the key's unique
        index until the first ends, then sees the conflict, so exactly one event is written.
        """
        return self._insert_events_with_dedup(count)

    @lru_cache(maxsize=256)  # noqa: B019 - a handful of instances, kept for the process
    def _insert_events_with_dedup(self, count: int) -> str:
        source = (
            _unnest(with_dedup=True)
            if count > MAX_VALUES_ROWS
            else _values_list(count, with_dedup=True, cast=True)
        )
        dedup = self.tables.qualified_dedup
        return (
            f"WITH batch ({_COLUMN_LIST}, dedup_key, ord) AS MATERIALIZED (\n{source}\n),\n"
            f"claimed AS (\n"
            f"    INSERT INTO {dedup} AS d (dedup_key, event_id)\n"
            f"    SELECT dedup_key, id FROM batch WHERE dedup_key IS NOT NULL\n"
            f"    ON CONFLICT (dedup_key) DO UPDATE\n"
            f"        SET event_id = EXCLUDED.event_id, created_at = clock_timestamp()\n"
            f"        WHERE d.created_at < clock_timestamp()"
            f" - make_interval(secs => %(dedup_window_seconds)s)\n"
            f"    RETURNING d.event_id\n"
            f")\n"
            f"INSERT INTO {self.tables.qualified_outbox} ({_COLUMN_LIST})\n"
            f"SELECT {_COLUMN_LIST} FROM batch\n"
            f"WHERE dedup_key IS NULL OR id IN (SELECT event_id FROM claimed)\n"
            f"ORDER BY ord\n"
            f"RETURNING id"
        )

    @cached_property
    def find_dedup_keys(self) -> str:
        return (
            f"SELECT dedup_key, event_id FROM {self.tables.qualified_dedup}\n"
            f"WHERE dedup_key = ANY(CAST(%(dedup_keys)s AS text[]))"
        )

    @cached_property
    def delete_expired_dedup_keys(self) -> str:
        return (
            f"DELETE FROM {self.tables.qualified_dedup}\n"
            f"WHERE created_at < clock_timestamp() - make_interval(secs => %(window_seconds)s)"
        )

    @cached_property
    def claim_message(self) -> str:
        return (
            f"INSERT INTO {self.tables.qualified_inbox} (consumer, message_id)\n"
            f"VALUES (%(consumer)s, %(message_id)s)\n"
            f"ON CONFLICT (consumer, message_id) DO NOTHING\n"
            f"RETURNING true"
        )

    @cached_property
    def delete_expired_claims(self) -> str:
        return (
            f"DELETE FROM {self.tables.qualified_inbox}\n"
            f"WHERE received_at < clock_timestamp() - make_interval(secs => %(window_seconds)s)"
        )
