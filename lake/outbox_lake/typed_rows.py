"""The typing planner: events of one aggregate type → typed rows, new columns, set-aside rows.

Pure (no I/O): given the parsed events of a batch and the typed table's columns so far, it
decides, row by row, what each payload field becomes. Every decision about one row stays
with that row: a payload the table cannot hold (see :mod:`outbox.core.lake_contract`), a
field whose type changed, a name that differs only in case from a column, or anything else
that goes wrong while typing it, sets *that row* aside with the reason; the batch goes on.

Column types: JSON booleans → boolean, integers → bigint, other numbers → double, strings →
string, objects and arrays → their JSON text. An integer fits a double column (widened); a
double never narrows into a bigint column. Types are decided by the first row that brings a
field (in the batch's offset order), then kept.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import pyarrow as pa

from outbox.core.contract import load_strict_json
from outbox.core.lake_contract import MAX_COLUMN_NAME, column_name_problem, scalar_problem

__all__ = ["TYPED_BASE", "TypedPlan", "plan_typed_rows"]

# A payload's field names repeat from event to event: each is judged once (names too long
# for a column are refused at once, and never kept in the cache).
_cached_name_problem = lru_cache(maxsize=4096)(column_name_problem)


def _name_problem(name: str) -> str | None:
    if len(name) > MAX_COLUMN_NAME:
        return column_name_problem(name)
    return _cached_name_problem(name)


# One encoder for the process (json.dumps with options builds one per call).
_NESTED_JSON = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)


TYPED_BASE = [
    ("event_id", pa.string()),
    ("aggregate_type", pa.string()),
    ("aggregate_id", pa.string()),
    ("event_type", pa.string()),
    ("position", pa.int64()),
    ("event_time", pa.timestamp("us", tz="UTC")),
    ("event_date", pa.date32()),
]
_BASE_NAMES = [name for name, _ in TYPED_BASE]


@dataclass
class TypedPlan:
    schema: pa.Schema
    """The base columns and every payload column the accepted rows use."""
    rows: list[dict[str, Any]] = field(default_factory=list)
    """Typed rows, each cell already of its column's type."""
    rejected: list[tuple[dict[str, Any], str]] = field(default_factory=list)
    """(event row, reason) for each row set aside."""

    built: pa.Table | None = None
    """The rows as a table, once built (planning checks that Arrow takes them)."""

    def table(self) -> pa.Table:
        if self.built is None:
            self.built = pa.Table.from_pylist(self.rows, schema=self.schema)
        return self.built


class _Refused(Exception):
    """One row cannot be typed; the message is the reason."""


def _column_type(value: Any) -> pa.DataType:
    if isinstance(value, bool):
        return pa.bool_()
    if isinstance(value, int):
        return pa.int64()
    if isinstance(value, float):
        return pa.float64()
    return pa.string()


def _cell(name: str, value: Any) -> Any:
    """The value as its column stores it; :class:`_Refused` when it cannot be stored."""
    problem = scalar_problem(name, value)
    if problem is not None:
        raise _Refused(problem)
    if isinstance(value, dict | list):
        try:
            text = _NESTED_JSON.encode(value)
            text.encode("utf-8")
        except (ValueError, UnicodeEncodeError) as error:
            raise _Refused(f"payload field {name!r} cannot be kept as JSON text: {error}") from None
        except RecursionError:
            raise _Refused(f"payload field {name!r} is nested too deeply") from None
        return text
    return value


def _load(payload_text: str) -> dict[str, Any]:
    try:
        payload = load_strict_json(payload_text)
    except RecursionError:
        raise _Refused("the payload is nested too deeply to type") from None
    if not isinstance(payload, dict):
        raise _Refused("the payload is not a JSON object: it has no typed row")
    return payload


def plan_typed_rows(
    events: list[dict[str, Any]], existing: dict[str, pa.DataType], table_name: str
) -> TypedPlan:
    """Type ``events`` (parsed rows of one aggregate type, in offset order) for the table
    whose payload columns so far are ``existing`` (name → Arrow type)."""
    columns: dict[str, pa.DataType] = {}
    by_lower = {name.lower(): name for name in [*_BASE_NAMES, *existing]}
    plan = TypedPlan(schema=pa.schema(TYPED_BASE))
    for event in events:
        try:
            cells, new = _type_row(event, existing, columns, by_lower, table_name)
        except _Refused as refused:
            plan.rejected.append((event, str(refused)))
            continue
        except Exception as error:  # whatever one row does, it stays that row's problem
            plan.rejected.append((event, f"cannot type this row: {type(error).__name__}: {error}"))
            continue
        for name, kind in new.items():
            columns[name] = kind
            by_lower[name.lower()] = name
        plan.rows.append({**{name: event.get(name) for name in _BASE_NAMES}, **cells})
    plan.schema = pa.schema(
        TYPED_BASE + [(name, existing.get(name, kind)) for name, kind in sorted(columns.items())]
    )
    _keep_storable(plan, events)
    return plan


def _keep_storable(plan: TypedPlan, events: list[dict[str, Any]]) -> None:
    """Whatever slipped through the checks above and Arrow still refuses: that row only."""
    try:
        plan.table()
        return
    except (pa.ArrowException, ValueError, TypeError, OverflowError):
        pass
    accepted = [event for event in events if not any(event is r for r, _ in plan.rejected)]
    rows = []
    for event, row in zip(accepted, plan.rows, strict=True):
        try:
            pa.Table.from_pylist([row], schema=plan.schema)
            rows.append(row)
        except (pa.ArrowException, ValueError, TypeError, OverflowError) as error:
            plan.rejected.append((event, f"cannot store this row: {type(error).__name__}: {error}"))
    plan.rows = rows


def _type_row(
    event: dict[str, Any],
    existing: dict[str, pa.DataType],
    columns: dict[str, pa.DataType],
    by_lower: dict[str, str],
    table_name: str,
) -> tuple[dict[str, Any], dict[str, pa.DataType]]:
    payload = _load(event["payload"])
    cells: dict[str, Any] = {}
    new: dict[str, pa.DataType] = {}
    row_lower: dict[str, str] = {}
    for name, value in payload.items():
        problem = _name_problem(name)
        if problem is not None:
            raise _Refused(problem)
        twin = row_lower.setdefault(name.lower(), name)
        if twin != name:
            raise _Refused(
                f"payload fields {twin!r} and {name!r} differ only in case: a lake column "
                "name is compared without case"
            )
        if value is None:
            continue
        cell = _cell(name, value)
        kind = _column_type(value)
        known = existing.get(name) or columns.get(name) or new.get(name)
        if known is None:
            column = by_lower.get(name.lower())
            if column is not None and column != name:
                raise _Refused(
                    f"payload field {name!r} differs only in case from the column {column!r} "
                    f"of {table_name}: rename the field"
                )
            new[name] = kind
        elif kind != known:
            if pa.types.is_integer(kind) and pa.types.is_floating(known):
                cell = float(cell)
            else:
                raise _Refused(f"payload field {name!r} is {kind} here but {known} in {table_name}")
        cells[name] = cell
    return cells, new


# -- on the executors: the same decisions, one batch at a time --------------------------------

_KIND_OF_ARROW = {pa.bool_(): "boolean", pa.int64(): "long", pa.float64(): "double"}
_ARROW_OF_KIND = {"boolean": pa.bool_(), "long": pa.int64(), "double": pa.float64()}
_BASE_LOWER = {name.lower(): name for name in _BASE_NAMES}


def kind_of(arrow: pa.DataType) -> str:
    """A payload column's kind (``boolean``, ``long``, ``double``, ``string``)."""
    return _KIND_OF_ARROW.get(arrow, "string")


def payload_columns(payload_text: str | None) -> list[tuple[str, str]] | None:
    """The columns this payload would bring to an empty typed table (name, kind), in its
    order; None when the payload cannot be typed on its own (it will be set aside)."""
    if payload_text is None:
        return None
    try:
        _, new = _type_row({"payload": payload_text}, {}, {}, dict(_BASE_LOWER), "the table")
    except Exception:
        return None
    return [(name, kind_of(kind)) for name, kind in new.items()]


def typed_batch_schema(columns: dict[str, str]) -> pa.Schema:
    """A typed table's rows as the executors give them: the base columns, ``columns``
    (name → kind, in order), and what a row set aside needs (``_reason`` and its record)."""
    return pa.schema(
        [
            *TYPED_BASE,
            *((name, _ARROW_OF_KIND.get(kind, pa.string())) for name, kind in columns.items()),
            ("_reason", pa.string()),
            ("_topic", pa.string()),
            ("_partition", pa.int32()),
            ("_offset", pa.int64()),
            ("_key", pa.binary()),
            ("_value", pa.binary()),
        ]
    )


def type_batch(
    events: list[dict[str, Any]], columns: dict[str, str], table_name: str
) -> pa.RecordBatch:
    """Type ``events`` (parsed rows of one aggregate type) into the table whose payload
    columns are exactly ``columns`` (decided on the driver for the whole batch): each row
    typed, or set aside with ``_reason``. Never raises for a row."""
    existing = {name: _ARROW_OF_KIND.get(kind, pa.string()) for name, kind in columns.items()}
    schema = typed_batch_schema(columns)
    by_lower = {**_BASE_LOWER, **{name.lower(): name for name in existing}}
    out = []
    for event in events:
        record = {
            "_topic": event.get("topic"),
            "_partition": event.get("partition"),
            "_offset": event.get("offset"),
            "_key": event.get("raw_key"),
            "_value": event.get("raw_value"),
        }
        base = {name: event.get(name) for name in _BASE_NAMES}
        try:
            cells, new = _type_row(event, existing, {}, dict(by_lower), table_name)
            if new:
                raise _Refused(
                    f"payload field {next(iter(new))!r} has no column in {table_name} this "
                    "batch: rename the field"
                )
            row = {**base, **cells, **record, "_reason": None}
        except _Refused as refused:
            row = {**base, **record, "_reason": str(refused)}
        except Exception as error:  # whatever one row does, it stays that row's problem
            reason = f"cannot type this row: {type(error).__name__}: {error}"
            row = {**base, **record, "_reason": reason}
        out.append(row)
    try:
        return pa.RecordBatch.from_pylist(out, schema=schema)
    except (pa.ArrowException, ValueError, TypeError, OverflowError):
        pass
    kept = []
    for row in out:  # whatever Arrow still refuses: that row only
        try:
            pa.RecordBatch.from_pylist([row], schema=schema)
        except (pa.ArrowException, ValueError, TypeError, OverflowError) as error:
            reason = f"cannot store this row: {type(error).__name__}: {error}"
            row = {name: row.get(name) for name in (*_BASE_NAMES, *_RECORD)} | {"_reason": reason}
        kept.append(row)
    return pa.RecordBatch.from_pylist(kept, schema=schema)


_RECORD = ("_topic", "_partition", "_offset", "_key", "_value")
