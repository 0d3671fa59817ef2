"""Typing: events of one aggregate type → typed rows, or rows set aside with the reason.

Pure (no I/O; it runs on Spark's executors, one Arrow batch at a time): given the parsed
events and the typed table's columns (decided on the driver for the batch), it decides, row
by row, what each payload field becomes. Every decision about one row stays with that row: a
payload the table cannot hold (see :mod:`outbox.core.lake_contract`), a field whose type
changed, a name that differs only in case from a column, or anything else that goes wrong
while typing it, sets *that row* aside with the reason; the batch goes on.

Column kinds, decided by the first record that brings a field (in offset order), then kept:

=====================================  ===================================================
JSON value                             column
=====================================  ===================================================
``true``/``false``                     ``boolean``
integer (``12``)                       ``bigint``
number with a fraction or an exponent  ``decimal(38,18)`` when it fits exactly (below
(``12.30``, ``2.5``, ``1e-3``)         10^20, at most 18 digits after the point), else
                                       ``double``
string                                 ``string``
object, array                          ``string`` (its JSON text)
=====================================  ===================================================

What a later value of another kind becomes: an integer fits a ``decimal`` or ``double``
column (widened); a fractional number in a ``decimal`` column keeps 18 digits after the
point (more are rounded, half to even), in a ``double`` column becomes the nearest double,
and in a ``string`` column (a table from before the SDK wrote ``Decimal`` as a number) is
kept as its exact text. A fractional number that fits ``decimal(38,18)`` exactly, in a
``bigint`` column, widens the *column* (:func:`widens`: money first sent as ``10``, then as
``9.90``): the column becomes ``decimal(38,18)``, its rows keep their values (``10`` is
``10.000000000000000000``), and from then on it is a ``decimal`` column like any other. A
fraction that does not fit exactly (more than 18 digits after the point, or 10^20 or more)
leaves a ``bigint`` column as it is and sets its row aside, the reason naming the fix: a
``double`` would make every sum of the column inexact. Anything else (a string into a
number column, a decimal of 10^20 or more into a ``decimal`` column) sets the row aside.

How the job finds a widening: typing a batch against the table's columns (``pending``), a
row with a fraction for a ``bigint`` column is marked pending, as a row bringing a new field
is; the driver then decides the columns from the pending rows' own kinds (a field's kind
``decimal`` met for a ``long`` column widens it), and those rows are typed again.
"""

from __future__ import annotations

from decimal import Decimal
from functools import lru_cache
from typing import Any

import pyarrow as pa

from outbox.core.contract import load_strict_json
from outbox.core.lake_contract import (
    DECIMAL_PRECISION,
    DECIMAL_SCALE,
    DECIMAL_TYPE,
    MAX_COLUMN_NAME,
    column_name_problem,
    decimal_column_value,
    decimal_fits,
    scalar_problem,
)
from outbox.core.payload import encode_parsed_json

__all__ = [
    "TYPED_BASE",
    "kind_of",
    "payload_columns",
    "type_batch",
    "typed_batch_schema",
    "widens",
]

DECIMAL = pa.decimal128(DECIMAL_PRECISION, DECIMAL_SCALE)

# A payload's field names repeat from event to event: each is judged once (names too long
# for a column are refused at once, and never kept in the cache).
_cached_name_problem = lru_cache(maxsize=4096)(column_name_problem)


def _name_problem(name: str) -> str | None:
    if len(name) > MAX_COLUMN_NAME:
        return column_name_problem(name)
    return _cached_name_problem(name)


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


class _Refused(Exception):
    """One row cannot be typed; the message is the reason."""


def _column_type(value: Any) -> pa.DataType:
    if isinstance(value, bool):
        return pa.bool_()
    if isinstance(value, int):
        return pa.int64()
    if isinstance(value, Decimal):
        return DECIMAL if decimal_fits(value) else pa.float64()
    if isinstance(value, float):
        return pa.float64()
    return pa.string()


def _into(name: str, cell: Any, kind: pa.DataType, known: pa.DataType, table_name: str) -> Any:
    """``cell`` (of ``kind``) as the column of type ``known`` stores it, when it can."""
    if known == DECIMAL and (pa.types.is_integer(kind) or isinstance(cell, Decimal)):
        value = Decimal(cell)
        stored = decimal_column_value(value)
        if stored is not None:
            return stored
        raise _Refused(
            f"payload field {name!r} = {value} does not fit the column's {DECIMAL_TYPE} "
            f"in {table_name} (10^20 or more): send it as a string"
        )
    if pa.types.is_floating(known) and (pa.types.is_integer(kind) or isinstance(cell, Decimal)):
        number = float(cell)
        problem = scalar_problem(name, number)
        if problem is not None:
            raise _Refused(problem)
        return number
    if known == pa.string() and isinstance(cell, Decimal):
        return str(cell)  # a column from before the SDK wrote Decimal as a number: its text
    if known == pa.int64() and isinstance(cell, Decimal) and not decimal_fits(cell):
        raise _Refused(_no_exact_decimal(name, cell, table_name))
    raise _Refused(
        f"payload field {name!r} is {_kind_name(kind)} here but {_kind_name(known)} in {table_name}"
    )


def _no_exact_decimal(name: str, value: Decimal, table_name: str) -> str:
    """Why a fraction no ``decimal(38,18)`` holds exactly stays out of a ``bigint`` column."""
    if decimal_column_value(value) is None:
        return (
            f"payload field {name!r} = {value} is a fraction of 10^20 or more, and the column "
            f"is bigint in {table_name}: neither a bigint nor a {DECIMAL_TYPE} holds it; send "
            "it as a string"
        )
    return (
        f"payload field {name!r} = {value} has more than 18 digits after the point, and the "
        f"column is bigint in {table_name}: it widens to {DECIMAL_TYPE} only for a fraction "
        "that type holds exactly; round it to 18 places (Decimal.quantize), or send it as a "
        "string"
    )


def widens(column: str | None, kind: str) -> bool:
    """Whether a value of ``kind`` widens a column of kind ``column`` (to ``kind``): only a
    ``decimal`` (a fraction that fits ``decimal(38,18)`` exactly) into a ``long`` column."""
    return column == "long" and kind == "decimal"


def _kind_name(kind: pa.DataType) -> str:
    return DECIMAL_TYPE if kind == DECIMAL else str(kind)


def _cell(name: str, value: Any) -> Any:
    """The value as its column stores it; :class:`_Refused` when it cannot be stored."""
    problem = scalar_problem(name, value)
    if problem is not None:
        raise _Refused(problem)
    if isinstance(value, dict | list):
        try:
            text = encode_parsed_json(value)
            text.encode("utf-8")
        except (ValueError, TypeError, UnicodeEncodeError) as error:
            raise _Refused(f"payload field {name!r} cannot be kept as JSON text: {error}") from None
        except RecursionError:
            raise _Refused(f"payload field {name!r} is nested too deeply") from None
        return text
    return value


def _load(payload_text: str) -> dict[str, Any]:
    try:
        payload = load_strict_json(payload_text, exact=True)
    except RecursionError:
        raise _Refused("the payload is nested too deeply to type") from None
    if not isinstance(payload, dict):
        raise _Refused("the payload is not a JSON object: it has no typed row")
    return payload


def _type_row(
    event: dict[str, Any],
    existing: dict[str, pa.DataType],
    columns: dict[str, pa.DataType],
    by_lower: dict[str, str],
    table_name: str,
    *,
    defer_fractions: bool = False,
) -> tuple[dict[str, Any], dict[str, pa.DataType], bool]:
    """The row's cells, the columns it brings, and whether it was left untyped for a
    fraction in a ``bigint`` column (``defer_fractions``: the column may widen)."""
    payload = _load(event["payload"])
    cells: dict[str, Any] = {}
    new: dict[str, pa.DataType] = {}
    deferred = False
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
            known = kind
        if defer_fractions and known == pa.int64() and isinstance(cell, Decimal):
            deferred = True  # typed again once the batch's columns are decided
            continue
        if kind != known or isinstance(cell, Decimal):
            # A Decimal goes as the column holds it, even one that fits exactly: its own
            # digits may be more than Arrow's 38 (1234567890.000000000000000000000000000000)
            cell = _into(name, cell, kind, known, table_name)
        cells[name] = cell
    return cells, new, deferred


# -- on the executors: the same decisions, one batch at a time --------------------------------

_KIND_OF_ARROW = {
    pa.bool_(): "boolean",
    pa.int64(): "long",
    pa.float64(): "double",
    DECIMAL: "decimal",
}
_ARROW_OF_KIND = {kind: arrow for arrow, kind in _KIND_OF_ARROW.items()}
_BASE_LOWER = {name.lower(): name for name in _BASE_NAMES}


def kind_of(arrow: pa.DataType) -> str:
    """A payload column's kind (``boolean``, ``long``, ``decimal``, ``double``, ``string``)."""
    return _KIND_OF_ARROW.get(arrow, "string")


def payload_columns(payload_text: str | None) -> list[tuple[str, str]] | None:
    """The columns this payload would bring to an empty typed table (name, kind), in its
    order; None when the payload cannot be typed on its own (it will be set aside)."""
    if payload_text is None:
        return None
    try:
        _, new, _ = _type_row({"payload": payload_text}, {}, {}, dict(_BASE_LOWER), "the table")
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
            ("_pending", pa.bool_()),
        ]
    )


def type_batch(
    events: list[dict[str, Any]],
    columns: dict[str, str],
    table_name: str,
    *,
    pending: bool = False,
) -> pa.RecordBatch:
    """Type ``events`` (parsed rows of one aggregate type) into the table whose payload
    columns are exactly ``columns``: each row typed, or set aside with ``_reason``. With
    ``pending``, a row whose payload brings a field the columns lack, or a fraction for a
    ``bigint`` column (which it may widen), is neither: it is marked ``_pending`` (typed
    again once the batch's columns are decided). Never raises for a row."""
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
            cells, new, deferred = _type_row(
                event, existing, {}, dict(by_lower), table_name, defer_fractions=pending
            )
            if (new or deferred) and pending:
                row = {**base, **record, "_reason": None, "_pending": True}
                out.append(row)
                continue
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
