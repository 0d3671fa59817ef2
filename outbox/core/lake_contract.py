"""What the lake can type: the rules a payload must follow to land in its typed table.

The lake keeps every event in ``events`` with its payload exactly as committed. It also
writes each event's top-level payload fields as columns of ``aggregate_<type>``; a payload
that breaks one of these rules lands in ``events`` all the same, and its typed row goes to
``quarantine`` with the reason. The SDK checks the same rules at publish time
(``OUTBOX_LAKE_CONTRACT``: ``warn`` by default, ``strict`` to refuse, ``off``), so a payload
the typed table would set aside is caught in the application's own tests.

One definition, used by both: the lake's typing planner (lake/outbox_lake/typed_rows.py) and the
SDK. (Pure: standard library only.)
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from decimal import ROUND_HALF_EVEN, Context, Decimal
from typing import Any

__all__ = [
    "DECIMAL_PRECISION",
    "DECIMAL_SCALE",
    "DECIMAL_TYPE",
    "INT64_MAX",
    "INT64_MIN",
    "MAX_COLUMN_NAME",
    "TYPED_BASE_COLUMNS",
    "column_name_problem",
    "decimal_column_value",
    "decimal_fits",
    "payload_problems",
    "scalar_problem",
]

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
MAX_COLUMN_NAME = 255

DECIMAL_PRECISION = 38
DECIMAL_SCALE = 18
"""A typed column of exact decimals is ``decimal(38, 18)`` (Spark's default for a decimal
of unknown size): 20 digits before the point, 18 after."""
DECIMAL_TYPE = f"decimal({DECIMAL_PRECISION},{DECIMAL_SCALE})"
"""Its name, as Delta's log and Spark write it."""
_DECIMAL_LIMIT = Decimal(10) ** (DECIMAL_PRECISION - DECIMAL_SCALE)
_QUANTUM = Decimal(1).scaleb(-DECIMAL_SCALE)
# Room for every digit of a decimal(38, 18) (the default context keeps 28: quantizing 1e16
# to 18 places would raise).
_COLUMN_CONTEXT = Context(prec=DECIMAL_PRECISION + 2, rounding=ROUND_HALF_EVEN)


def decimal_column_value(value: Decimal) -> Decimal | None:
    """``value`` as a ``decimal(38, 18)`` column holds it (18 digits after the point, more
    rounded half to even), or ``None`` when no such column can (10^20 or more, not finite)."""
    if not value.is_finite() or abs(value) >= _DECIMAL_LIMIT:
        return None
    rounded = value.quantize(_QUANTUM, context=_COLUMN_CONTEXT)
    return rounded if abs(rounded) < _DECIMAL_LIMIT else None


def decimal_fits(value: Decimal, *, exactly: bool = True) -> bool:
    """Whether ``value`` fits a ``decimal(38, 18)`` column: below 10^20 in magnitude and, when
    ``exactly``, with no digit but zeros beyond the 18th after the point."""
    stored = decimal_column_value(value)
    return stored is not None and (not exactly or stored == value)


TYPED_BASE_COLUMNS = (
    "event_id",
    "aggregate_type",
    "aggregate_id",
    "event_type",
    "position",
    "event_time",
    "event_date",
)
"""The columns every typed table has before the payload's own; a payload field may not take
one of these names, in any case."""

_RESERVED = frozenset(name.lower() for name in TYPED_BASE_COLUMNS)
# Characters a Delta column name may not hold without column mapping (Spark refuses them),
# and the backtick, which quotes names in SQL.
_FORBIDDEN = frozenset(" ,;{}()\n\t=`")


def column_name_problem(name: str) -> str | None:
    """Why the payload field ``name`` cannot be a typed column, or ``None``."""
    if not name:
        return "an empty field name cannot be a column"
    if len(name) > MAX_COLUMN_NAME:
        return f"field name {name[:40]!r}... is longer than {MAX_COLUMN_NAME} characters"
    if name.lower() in _RESERVED:
        return (
            f"payload field {name!r} clashes with the lake column {name.lower()!r} "
            "(names are compared without case): rename the field"
        )
    bad = sorted({char for char in name if char in _FORBIDDEN or not char.isprintable()})
    if bad:
        return (
            f"payload field {name!r} has characters a Delta column name cannot hold "
            f"({''.join(bad)!r}): use letters, digits, '_', '-' or '.'"
        )
    if not _is_utf8(name):
        return f"payload field {name!r} is not valid Unicode text (a lone surrogate)"
    return None


def scalar_problem(name: str, value: Any) -> str | None:
    """Why a top-level value cannot be stored in a typed column, or ``None``."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int):
        if not INT64_MIN <= value <= INT64_MAX:
            return (
                f"payload field {name!r} = {value} is outside a 64-bit integer's range: send it "
                "as a string"
            )
        return None
    if isinstance(value, float):
        if not math.isfinite(value):
            return (
                f"payload field {name!r} is too large for a double (it reads as {value}): "
                "send it as a string; events.payload keeps the exact text"
            )
        return None
    if isinstance(value, Decimal):
        # A finite double takes any Decimal a decimal(38,18) column cannot: only one beyond
        # a double's range fits neither.
        if not math.isfinite(float(value)):
            return (
                f"payload field {name!r} is too large for a double or a {DECIMAL_TYPE} "
                f"({value}): send it as a string; events.payload keeps the exact text"
            )
        return None
    if isinstance(value, str) and not _is_utf8(value):
        return f"payload field {name!r} holds text that is not valid Unicode (a lone surrogate)"
    return None


def payload_problems(payload: Any) -> list[str]:
    """Every reason the lake's typed table would set this payload's row aside.

    Checked per event; a field whose type differs from earlier events of the same aggregate
    type (a number here, a string there) is only known to the lake, and quarantined there.
    """
    if not isinstance(payload, Mapping):
        return [
            f"the payload is a JSON {type(payload).__name__}, not an object: it lands in "
            "events.payload but has no typed row"
        ]
    problems: list[str] = []
    seen: dict[str, str] = {}
    for name, value in payload.items():
        if not isinstance(name, str):
            problems.append(f"payload field {name!r} is not a string")
            continue
        problem = column_name_problem(name) or scalar_problem(name, value)
        if problem is not None:
            problems.append(problem)
            continue
        other = seen.setdefault(name.lower(), name)
        if other != name:
            problems.append(
                f"payload fields {other!r} and {name!r} differ only in case: a lake column "
                "name is compared without case; rename one"
            )
    return problems


def _is_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
