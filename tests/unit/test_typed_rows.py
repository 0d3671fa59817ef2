"""Typing on the executors, the SDK's lake contract, and typed table names (pure: no Spark,
no I/O)."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from outbox.core.lake_contract import payload_problems
from outbox.core.payload import encode_json
from outbox_lake.names import typed_table_name
from outbox_lake.typed import decide_columns
from outbox_lake.typed_rows import payload_columns, type_batch, typed_batch_schema


def event(payload_text: str, **extra: Any) -> dict[str, Any]:
    return {
        "event_id": str(uuid.uuid4()),
        "aggregate_type": "order",
        "aggregate_id": "1",
        "event_type": "Placed",
        "position": 1,
        "event_time": datetime(2026, 11, 23, tzinfo=UTC),
        "event_date": date(2026, 11, 23),
        "payload": payload_text,
        **extra,
    }


def typed(rows: list[dict[str, Any]], existing: dict[str, str]) -> list[dict[str, Any]]:
    """What the job does with a batch: columns decided on the driver from each record's own
    fields (in offset order), then every row typed against them on the executors."""
    met = [
        (("t", 0, offset), name, kind)
        for offset, row in enumerate(rows)
        for name, kind in payload_columns(row["payload"]) or ()
    ]
    columns = decide_columns(existing, met)
    batch = type_batch(rows, columns, "aggregate_order")
    assert batch.schema == typed_batch_schema(columns)
    return batch.to_pylist()


def kept(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [row for row in rows if row["_reason"] is None]


def reasons(rows: list[dict[str, Any]]) -> list[str]:
    return [row["_reason"] for row in rows if row["_reason"] is not None]


def test_each_untypable_row_is_set_aside_with_a_reason_naming_the_field() -> None:
    rows = [
        event('{"ok": 1, "name": "a"}'),
        event('{"big": 9223372036854775808}'),
        event('{"huge": 1e400}'),
        event('{"Total": 1, "total": 2}'),
        event('{"EVENT_ID": "x"}'),
        event('{"a b": 1}'),
        event('{"nested": {"x": "\\u0000"}, "n": 1.5e-20, "m": [1e400]}'),
        event("[1, 2]"),
        event('{"deep": ' + "[" * 100_000 + "]" * 100_000 + "}"),
    ]
    out = typed(rows, {})
    assert [row["event_id"] for row in kept(out)] == [rows[0]["event_id"], rows[6]["event_id"]]
    assert (kept(out)[1]["nested"], kept(out)[1]["n"]) == ('{"x":"\\u0000"}', 1.5e-20)
    assert kept(out)[1]["m"] == "[1" + "0" * 400 + ".0]"  # exact, as no double holds it
    found = reasons(out)
    assert len(found) == len(rows) - 2
    for expected in (
        "'big'",
        "'huge' is too large for a double",
        "'Total' and 'total' differ only in case",
        "clashes with the lake column 'event_id'",
        "'a b' has characters",
        "not a JSON object",
        "nested too deeply",
    ):
        assert any(expected in reason for reason in found), (expected, found)


def test_types_are_kept_across_batches_numbers_widen_and_case_twins_are_refused() -> None:
    existing = {"Total": "double", "count": "long"}
    rows = [
        event('{"Total": 3, "count": 2}'),
        event('{"count": 2.5}'),
        event('{"total": 1.0}'),
        event('{"new": "x"}'),
        event('{"new": 1}'),
    ]
    out = typed(rows, existing)
    assert out[0]["Total"] == 3.0 and isinstance(out[0]["Total"], float)
    # a fraction widens the bigint column: both rows land, as decimals
    assert (out[0]["count"], out[1]["count"]) == (Decimal(2), Decimal("2.5"))
    assert out[3]["new"] == "x"
    found = reasons(out)
    assert "differs only in case from the column 'Total'" in found[0]
    assert "'new' is int64 here but string" in found[1]
    assert list(out[0])[:7] == [
        "event_id",
        "aggregate_type",
        "aggregate_id",
        "event_type",
        "position",
        "event_time",
        "event_date",
    ]


def test_decimals_the_sdk_writes_land_exact_in_a_decimal_column_that_sums() -> None:
    totals = [Decimal("9.90"), Decimal("0.10"), Decimal("12"), Decimal("0.01")] * 25
    rows = [event(encode_json({"total": total, "qty": 2})) for total in totals]
    out = typed(rows, {})
    assert reasons(out) == []
    assert payload_columns(rows[0]["payload"]) == [("total", "decimal"), ("qty", "long")]
    assert sum(row["total"] for row in out) == sum(totals) == Decimal("550.25")
    assert float(sum(float(t) for t in totals)) != 550.0  # what a double column would give


def test_a_decimal_over_38_digits_only_by_trailing_zeros_lands_in_its_column() -> None:
    """The review's case: the SDK accepts it, and it fits decimal(38,18) exactly; Arrow
    refused the Decimal as written (40 digits)."""
    value = Decimal("1234567890.000000000000000000000000000000")
    out = typed([event(encode_json({"total": value}))], {})
    assert reasons(out) == []
    assert out[0]["total"] == value
    again = typed([event(encode_json({"total": value}))], {"total": "decimal"})
    assert reasons(again) == [] and again[0]["total"] == value


def test_what_a_number_of_another_kind_becomes_in_an_existing_column() -> None:
    existing = {"amount": "decimal", "ratio": "double", "note": "string", "count": "long"}
    rows = [
        event('{"amount": 7}'),  # integer into decimal: widened
        event('{"amount": 0.1234567890123456789012}'),  # beyond 18 places: rounded
        event('{"amount": 1e25}'),  # 10^20 or more: set aside
        event('{"ratio": 12.30}'),  # into a double column: the nearest double
        event('{"note": 12.30}'),  # into a string column from before: its exact text
        event('{"count": 2.5}'),  # widens the bigint column to decimal
        event('{"amount": "12.30"}'),  # a string is not a number
    ]
    out = typed(rows, existing)
    assert out[0]["amount"] == Decimal(7)
    assert out[1]["amount"] == Decimal("0.123456789012345679")
    assert "'amount' = 1E+25 does not fit the column's decimal(38,18)" in str(out[2]["_reason"])
    assert out[3]["ratio"] == 12.3
    assert out[4]["note"] == "12.30"
    assert out[5]["count"] == Decimal("2.5")
    assert "'amount' is string here but decimal(38,18)" in str(out[6]["_reason"])


def test_a_fraction_that_no_decimal_column_holds_exactly_brings_a_double_column() -> None:
    assert payload_columns(
        '{"tiny": 5e-324, "big": 1e300, "fine": 1e-18, "ms": 1.7e12, "e16": 1e16,'
        ' "wide": 12345678901.5, "edge": 99999999999999999999.9999999999999999999}'
    ) == [
        ("tiny", "double"),
        ("big", "double"),
        ("fine", "decimal"),
        ("ms", "decimal"),
        ("e16", "decimal"),
        ("wide", "decimal"),
        ("edge", "double"),  # rounded to 18 places it would be 10^20
    ]
    out = typed([event('{"e16": 1e16, "n": 12345678901}')], {"e16": "decimal", "n": "decimal"})
    assert (out[0]["e16"], out[0]["n"]) == (Decimal(10) ** 16, Decimal(12345678901))
    out = typed([event('{"tiny": 5e-324, "big": 1e300, "nested": {"x": 1.50, "y": [2.0]}}')], {})
    assert (out[0]["tiny"], out[0]["big"]) == (5e-324, 1e300)
    assert out[0]["nested"] == '{"x":1.50,"y":[2.0]}'  # nested numbers keep their digits


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner),
    max_leaves=10,
)
payloads = st.dictionaries(st.text(max_size=8), json_values, max_size=6)


@settings(max_examples=300, deadline=None)
@given(st.lists(payloads | json_values, max_size=8))
def test_every_row_is_typed_or_set_aside_never_both_and_never_raises(payloads: list[Any]) -> None:
    rows = [event(json.dumps(payload)) for payload in payloads]
    out = typed(rows, {})
    assert [row["event_id"] for row in out] == [row["event_id"] for row in rows]


@settings(max_examples=300, deadline=None)
@given(json_values | payloads)
def test_a_payload_the_sdk_accepts_is_typed_by_the_lake(payload: Any) -> None:
    """The schema contract: what the SDK's check passes, a fresh typed table takes."""
    out = typed([event(json.dumps(payload))], {})
    if not payload_problems(payload):
        assert kept(out), reasons(out)
    else:
        assert reasons(out)


def test_typed_table_names_never_collide() -> None:
    types = ["order", "Order", "ORDER", "order.v2", "order_v2", "order-v2", "order__v2", "o"]
    names = [typed_table_name(t) for t in types]
    assert len(set(names)) == len(types), names
    assert typed_table_name("order") == "aggregate_order"
    assert typed_table_name("order_v2") == "aggregate_order_v2"
    assert typed_table_name("Order").startswith("aggregate_order__")


@given(st.text(min_size=1, max_size=20), st.text(min_size=1, max_size=20))
def test_distinct_types_get_distinct_tables(first: str, second: str) -> None:
    if first != second:
        assert typed_table_name(first) != typed_table_name(second)


def test_a_batch_columns_are_those_of_the_record_that_first_brought_each_field() -> None:
    met = [
        (("t", 0, 9), "total", "double"),
        (("t", 0, 3), "total", "long"),
        (("t", 0, 5), "Total", "long"),
        (("t", 1, 0), "coupon", "string"),
        (("t", 0, 1), "EVENT_ID", "string"),
    ]
    assert decide_columns({"customer": "string"}, met) == {
        "customer": "string",
        "total": "long",
        "coupon": "string",
    }
    assert decide_columns({"Total": "double"}, met)["Total"] == "double"
    assert "total" not in decide_columns({"Total": "double"}, met)


def test_each_payload_names_the_columns_it_would_bring() -> None:
    assert payload_columns('{"a": 1, "b": 1.5, "c": "x", "d": true, "e": [1], "f": null}') == [
        ("a", "long"),
        ("b", "decimal"),
        ("c", "string"),
        ("d", "boolean"),
        ("e", "string"),
    ]
    assert payload_columns("[1, 2]") is None
    assert payload_columns('{"x": 1e400}') is None
    assert payload_columns('{"Total": 1, "total": 2}') is None


def test_typing_on_the_executors_sets_aside_only_the_rows_that_do_not_fit() -> None:
    columns = {"total": "double", "customer": "string"}
    rows = [
        event('{"total": 3, "customer": "c"}', topic="t", partition=0, offset=1),
        event('{"total": "lots"}', topic="t", partition=0, offset=2, raw_key=b"k", raw_value=b"v"),
        event('{"Customer": "x"}', topic="t", partition=0, offset=3),
        event('{"coupon": "new"}', topic="t", partition=0, offset=4),
        event("[1]", topic="t", partition=0, offset=5),
    ]
    typed = type_batch(rows, columns, "aggregate_order").to_pylist()
    assert typed[0]["_reason"] is None and typed[0]["total"] == 3.0
    reasons = [row["_reason"] for row in typed]
    assert "'total' is string here but double" in reasons[1]
    assert (typed[1]["_key"], typed[1]["_value"], typed[1]["_offset"]) == (b"k", b"v", 2)
    assert "differs only in case from the column 'customer'" in reasons[2]
    assert "'coupon' has no column" in reasons[3]
    assert "not a JSON object" in reasons[4]
