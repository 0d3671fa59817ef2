"""`outbox lake query`'s answer as a table, CSV or JSON: exact decimals, NULL said. (Pure.)"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from decimal import Decimal

from outbox_cli.lake import render_answer

COLUMNS = ["customer", "total", "paid_at", "note"]
ROWS = [
    ("c1", Decimal("9.900000000000000000"), datetime(2026, 11, 28, 12, 0, tzinfo=UTC), None),
    ("c2", Decimal("10.000000000000000000"), None, "x"),
]


def test_a_table_shows_decimals_without_padding_and_null_as_null() -> None:
    text = render_answer(COLUMNS, ROWS, "table")
    assert "9.9 " in text and "10 " in text and "000000" not in text
    assert "NULL" in text and "2026-11-28T12:00:00+00:00" in text
    assert "2 rows" in text


def test_csv_has_a_header_and_empty_cells_for_null() -> None:
    assert render_answer(COLUMNS, ROWS, "csv").splitlines() == [
        "customer,total,paid_at,note",
        "c1,9.9,2026-11-28T12:00:00+00:00,",
        "c2,10,,x",
    ]


def test_json_keeps_decimals_exact_as_strings() -> None:
    answer = json.loads(render_answer(COLUMNS, ROWS, "json"))
    assert answer[0] == {
        "customer": "c1",
        "total": "9.9",
        "paid_at": "2026-11-28T12:00:00+00:00",
        "note": None,
    }
    assert json.loads(render_answer(["n"], [(3,)], "json")) == [{"n": 3}]
