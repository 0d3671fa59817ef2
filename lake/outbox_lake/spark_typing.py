"""Typing in the JVM: the common rows of a typed table, decided by Spark's built-in functions.

:mod:`outbox_lake.typed_rows` is the one definition of the typing rules (Python, one row at a
time on the executors). Most rows of a table that exists are plain: every payload field is
a column the table has, each value of its column's kind. Those rows are typed here, in the
JVM (``parse_json``, ``variant_get``); every other row is left to the Python rules, which
make the typed row or set it aside with the reason. So this path only says "yes" where the
Python rules say "yes" with the same cells; a property test draws payloads and columns and
checks exactly that (tests/integration/test_lake_typing_paths.py).

A row is decided here when its payload is one JSON object (``parse_json``'s strict parser:
no duplicate key, no lone surrogate) whose every key is a column of the table, exactly, and
each value is JSON ``null`` or, by its column's kind:

=========  ==============================================================================
column     value decided here
=========  ==============================================================================
boolean    ``true``, ``false``
long       an integer of 64 bits
decimal    an integer of 64 bits; a number with a fraction that ``decimal(38,18)`` holds
           exactly (``parse_json`` drops trailing zeros: ``10.00`` is ``DECIMAL(2,0)``;
           a whole ``DECIMAL`` of 19 digits or more may be an integer beyond 64 bits, which
           the Python rules refuse: left to them)
double     a finite number with an exponent; an integer of 64 bits
string     a JSON string
=========  ==============================================================================

Everything else (an object or array value, a number in a ``string`` column, a fraction for a
``long`` column, which may widen it, a decimal for a ``double`` column, a key the table
lacks, a column whose name no ``variant_get`` path can spell or that the rules refuse
today) is left to Python. (Pure:
builds column expressions, runs nothing.)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from outbox.core.lake_contract import column_name_problem
from outbox_lake.spark_contract import sql_text, vouched_object

if TYPE_CHECKING:
    from pyspark.sql import Column

__all__ = ["JvmTyping", "jvm_typing", "variant_path"]

_INTEGER = ("TINYINT", "SMALLINT", "INT", "BIGINT")
_VALUE_TYPES = {
    "boolean": "boolean",
    "long": "bigint",
    "decimal": "decimal(38,18)",
    "double": "double",
    "string": "string",
}


def variant_path(name: str) -> str | None:
    """The ``variant_get`` path of the top-level key ``name`` (its text is taken as it is
    between the quotes), or None when no quoting can spell it."""
    if "'" not in name:
        return f"$['{name}']"
    if '"' not in name:
        return f'$["{name}"]'
    return None


def _fits(kind: str, column: str, value: str) -> str:
    """SQL: the value ``value`` (a variant), whose ``schema_of_variant`` is ``kind``, is
    decided here for a column of kind ``column`` (one of :data:`_VALUE_TYPES`)."""
    integer = f"{kind} IN ({', '.join(sql_text(k) for k in _INTEGER)})"
    if column == "boolean":
        return f"{kind} = 'BOOLEAN'"
    if column == "long":
        return integer
    if column == "string":
        return f"{kind} = 'STRING'"
    if column == "double":
        number = f"try_variant_get({value}, '$', 'double')"
        return (
            f"({integer} OR ({kind} = 'DOUBLE' AND NOT isnan({number})"
            f" AND abs({number}) < double('Infinity')))"
        )
    pattern = "'^DECIMAL\\\\((\\\\d+),(\\\\d+)\\\\)$'"  # decimal
    precision = f"try_cast(regexp_extract({kind}, {pattern}, 1) AS int)"
    scale = f"try_cast(regexp_extract({kind}, {pattern}, 2) AS int)"
    return (
        f"({integer} OR ({kind} LIKE 'DECIMAL(%' AND ("
        f"({scale} BETWEEN 1 AND 18 AND {precision} - {scale} <= 20)"
        f" OR ({scale} = 0 AND {precision} <= 18))))"
    )


class JvmTyping:
    """The two halves of typing a table's rows in the JVM: which rows (``decided``) and
    their payload columns' values (``values``: name → column)."""

    def __init__(self, decided: Column, values: dict[str, Column]) -> None:
        self.decided = decided
        self.values = values


def jvm_typing(columns: dict[str, str], payload: str = "payload") -> JvmTyping | None:
    """The rows of a table with payload ``columns`` (name → kind) that the JVM types, and
    how; None when a column's name or kind keeps every row of the table to Python."""
    from pyspark.sql import functions as f

    variant = f"try_parse_json({payload})"
    # one JSON object and nothing after it (parse_json alone ignores what follows a value)
    checks = [vouched_object(payload), f"{variant} IS NOT NULL"]
    names = ", ".join(sql_text(name) for name in columns) or "CAST(NULL AS string)"
    checks.append(f"forall(json_object_keys({payload}), k -> array_contains(array({names}), k))")
    values = {}
    for name, kind in columns.items():
        path = variant_path(name)
        if column_name_problem(name) is not None:
            return None  # a column from an earlier release: its rows stay with Python's rules
        value_type = _VALUE_TYPES.get(kind)
        if path is None or value_type is None:
            return None
        value = f"variant_get({variant}, {sql_text(path)})"
        of = f"schema_of_variant({value})"
        checks.append(f"({of} IS NULL OR {of} = 'VOID' OR {_fits(of, kind, value)})")
        values[name] = f.expr(
            f"try_variant_get({variant}, {sql_text(path)}, '{value_type}')"
        ).alias(name)
    decided = f.coalesce(f.expr(" AND ".join(f"({check})" for check in checks)), f.lit(False))
    return JvmTyping(decided, values)
