"""Typed tables are typed twice over: Spark's built-in functions type the plain rows of a
table, the Python rules (:mod:`outbox_lake.typed_rows`) the rest. Both must type alike:
drawn payloads (every kind of value, odd numbers, odd names, broken JSON) against drawn
columns, each row the JVM decides compared with what the Python rules make of it. (Spark
in this process: no service.)"""

from __future__ import annotations

import json
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from outbox import new_event_id
from tests.fix_lake import shared_spark

EVENTS_SCHEMA = (
    "event_id string, aggregate_type string, aggregate_id string, event_type string, "
    "payload string, position long, event_time timestamp, event_date date, topic string, "
    "partition int, offset long"
)
KINDS = ("boolean", "long", "decimal", "double", "string")
NAMES = ("n", "amount", "b.c", "d'e", 'x"y', "a\\b", "Été", "h[0]", "fee-net")

_digits = st.text(alphabet="0123456789", min_size=1, max_size=24)
value_texts = st.one_of(
    st.sampled_from(["null", "true", "false", '"x"', '""', "[1]", '{"a": 1}', "[]", "{}"]),
    st.integers(min_value=-(2**70), max_value=2**70).map(str),
    st.tuples(st.booleans(), _digits, _digits).map(
        lambda t: ("-" if t[0] else "") + t[1].lstrip("0").rjust(1, "0") + "." + t[2]
    ),
    st.tuples(st.integers(-(10**6), 10**6), st.integers(-400, 400)).map(lambda t: f"{t[0]}e{t[1]}"),
    st.sampled_from(["10.00", "9.90", "0.10", "1234567890.000000000000000000000000000000"]),
    st.text(max_size=8).map(json.dumps),
    st.sampled_from(['"\\ud800"', '"a\\u0000b"']),
)


@st.composite
def payloads(draw: Any, names: list[str]) -> str:
    if draw(st.integers(0, 20)) == 0:
        return draw(st.sampled_from(["[1]", "1", '"x"', "{} x", '{"n": 1, "n": 2}', "{bad"]))
    keys = draw(st.lists(st.sampled_from([*names, "other", "N"]), max_size=len(names) + 1))
    fields = [f"{json.dumps(key)}: {draw(value_texts)}" for key in keys]
    return "{" + ", ".join(fields) + "}"


@st.composite
def tables(draw: Any) -> tuple[dict[str, str], list[str]]:
    chosen = draw(st.lists(st.sampled_from(NAMES), min_size=1, max_size=5, unique=True))
    columns = {name: draw(st.sampled_from(KINDS)) for name in chosen}
    return columns, [draw(payloads(list(columns))) for _ in range(60)]


def _rows(texts: list[str]) -> list[tuple[Any, ...]]:
    now = datetime.now(UTC)
    return [
        (new_event_id(), "t", str(n), "E", text, n, now, date.today(), "outbox.event.t", 0, n)
        for n, text in enumerate(texts)
    ]


def _jvm_decided(columns: dict[str, str], texts: list[str]) -> dict[int, dict[str, Any]]:
    """{offset: typed cells} of the rows the JVM decides."""
    from pyspark.sql import functions as f

    from outbox_lake.spark_typing import jvm_typing

    spark = shared_spark()
    jvm = jvm_typing(columns)
    assert jvm is not None, columns
    frame = spark.createDataFrame(_rows(texts), EVENTS_SCHEMA)
    decided = frame.where(jvm.decided).select(f.col("offset"), *jvm.values.values())
    return {row["offset"]: row.asDict() for row in decided.collect()}


def _python(columns: dict[str, str], text: str) -> dict[str, Any]:
    from outbox_lake.typed_rows import type_batch

    (row,) = type_batch([{"payload": text}], columns, "aggregate_t", pending=True).to_pylist()
    return row


@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(table=tables())
def test_the_jvm_types_only_what_the_python_rules_type_alike(
    table: tuple[dict[str, str], list[str]],
) -> None:
    columns, texts = table
    decided = _jvm_decided(columns, texts)
    for offset, cells in decided.items():
        python = _python(columns, texts[offset])
        assert python["_reason"] is None and not python["_pending"], (columns, texts[offset])
        for name in columns:
            assert cells[name] == python.get(name), (name, columns, texts[offset])
            assert type(cells[name]) is type(python.get(name)), (name, texts[offset])


def test_the_plain_rows_of_a_table_are_typed_by_the_jvm() -> None:
    """The fast path is the common path: rows whose fields are the table's columns, each of
    its column's kind (money with trailing zeros, a missing field, a null), are all
    decided there, with the cells the Python rules give."""
    columns = {"total": "decimal", "n": "long", "paid": "boolean", "who": "string", "r": "double"}
    texts = [
        '{"total": 9.90, "n": 3, "paid": true, "who": "c1", "r": 1.5e3}',
        '{"total": 10.00, "n": -1, "paid": false, "who": "", "r": 7}',
        '{"total": 10, "who": null}',
        '{"total": 12345678901234567890.123456789012345678}',
        "{}",
    ]
    decided = _jvm_decided(columns, texts)
    assert sorted(decided) == list(range(len(texts)))
    for offset, cells in decided.items():
        python = _python(columns, texts[offset])
        assert {name: cells[name] for name in columns} == {
            name: python.get(name) for name in columns
        }
    assert decided[1]["total"] == Decimal("10.000000000000000000")


def test_what_the_python_rules_decide_otherwise_is_left_to_them() -> None:
    """A fraction for a ``bigint`` column (it may widen the column), a field the table
    lacks, a number in a ``string`` column, an integer beyond 64 bits that looks like a
    whole decimal, a nested value: none is decided by the JVM."""
    columns = {"amount": "long", "who": "string", "total": "decimal"}
    texts = [
        '{"amount": 9.90}',
        '{"amount": 1, "new": 2}',
        '{"who": 12}',
        '{"total": 12345678901234567890}',
        '{"who": {"a": 1}}',
        '{"Amount": 1}',
        "[1]",
    ]
    assert _jvm_decided(columns, texts) == {}


def test_a_column_the_rules_refuse_today_keeps_its_table_with_python() -> None:
    """A table from an earlier release may hold a column today's name rules refuse, or one
    no ``variant_get`` path spells: all its rows are typed by the Python rules."""
    from outbox_lake.spark_typing import jvm_typing

    shared_spark()
    assert jvm_typing({"n": "long", "É t": "string"}) is None
    assert jvm_typing({"n": "long", "a'b\"c": "string"}) is None
    assert jvm_typing({"n": "long", "when": "timestamp"}) is None
    assert jvm_typing({"n": "long"}) is not None
