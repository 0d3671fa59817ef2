"""The lake reads the contract twice over: Spark's built-in functions decide every record the
delivery paths write, the Python contract decides the rest. Both must decide alike: drawn
records (valid, malformed, raw bytes, odd headers) through Spark's path, each compared with
what ``outbox.core.contract`` makes of it. (Spark in this process: no service.)"""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from outbox import new_event_id
from outbox.core.contract import record_for
from outbox_lake.offsets import fingerprint
from outbox_lake.records import parse_one, record_quarantine_id
from tests.fix_lake import shared_spark

RAW_SCHEMA = (
    "key binary, value binary, topic string, partition int, offset long, timestamp timestamp, "
    "headers array<struct<key:string,value:binary>>"
)

_json_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=12),
)
json_values = st.recursive(
    _json_leaf,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=12,
)
odd_texts = st.sampled_from(
    [
        "{} x",
        "{}]",
        '{"a":1} {"b":2}',
        '{"a":1,"a":2}',
        "NaN",
        '{"a": Infinity}',
        "\ufeff{}",
        "01",
        '{"a":1e400}',
        '"\\ud800"',
        " {} ",
        "{}\x0b",
        '{"a":"\x01"}',
        "",
        "1,0]",
        "{'a':1}",
        "[" * 1200 + "]" * 1200,
        '{"a":[1,2}',
        "true",
        "null",
        '{"x": 1.000000000000000000000000000000000000001}',
    ]
)
raw_bytes = st.binary(max_size=24) | st.sampled_from([b"\xff", b"\xed\xa0\x80", b"\xc0\xaf", b""])


@st.composite
def records(draw: Any) -> tuple[Any, ...]:
    """A contract record as a delivery path writes it, then perhaps broken somewhere."""
    payload = draw(json_values.map(json.dumps) | odd_texts)
    headers_text = draw(st.sampled_from(["{}", '{"tenant": "a"}', "[]", "{bad", ""]))
    record = record_for(
        event_id=new_event_id(),
        aggregate_type=draw(st.sampled_from(["order", "Order.v2", "a_b"])),
        aggregate_id=draw(st.text(max_size=8)),
        event_type=draw(st.sampled_from(["Placed", "É", "x"])),
        payload_text=payload,
        headers_text=headers_text,
        traceparent=draw(st.sampled_from(["", "00-abc-def-01"])),
        position=draw(st.integers(min_value=0, max_value=2**63 - 1)),
    )
    headers = [(name, value) for name, value in record.headers]
    key: bytes | None = record.key
    value: bytes | None = record.value
    topic = record.topic
    for change in draw(st.lists(st.integers(min_value=0, max_value=15), max_size=2)):
        if change == 0:
            headers = draw(st.permutations(headers))
        elif change == 1 and headers:
            headers.pop(draw(st.integers(min_value=0, max_value=len(headers) - 1)))
        elif change == 2 and headers:
            headers.append(headers[0])
        elif change in (3, 4, 5, 6, 7, 11, 12, 14, 15) and len(headers) < 5:
            continue  # a header dropped already: nothing to change there
        elif change == 3:
            headers[0] = ("id", str(uuid.uuid4()).encode())  # a v4 id
        elif change == 4:
            headers[0] = ("id", headers[0][1].upper())
        elif change == 5:
            headers[0] = ("id", draw(raw_bytes))
        elif change == 6:
            headers[4] = (
                "position",
                draw(st.sampled_from([b"", b"-1", b"1.5", b"9" * 20, b"007"])),
            )
        elif change == 7:
            headers[1] = ("eventType", draw(raw_bytes))
        elif change == 8:
            key = draw(st.none() | raw_bytes)
        elif change == 9:
            value = draw(st.none() | raw_bytes)
        elif change == 10:
            topic = draw(st.sampled_from(["other", "outbox.event.", "outbox.events.x"]))
        elif change == 11:
            headers[3] = ("headers", draw(raw_bytes))
        elif change == 12:
            headers[2] = ("traceparent", draw(raw_bytes))
        elif change == 13:
            headers = [(name if i else "Id", v) for i, (name, v) in enumerate(headers)]
        elif change == 14:
            headers[0] = ("id", b"ffffffff-ffff-7fff-bfff-ffffffffffff")  # beyond year 9999
        elif change == 15:
            headers[0] = (draw(st.sampled_from(["retry", "id"])), b"-1")  # conv's minus sign
    return (key, value, topic, headers)


@settings(
    max_examples=4,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(batch=st.lists(records(), min_size=40, max_size=80))
def test_the_jvm_decides_only_what_the_python_contract_decides_alike(batch: list[Any]) -> None:
    from outbox_lake.landing import quarantine_id
    from outbox_lake.spark_contract import read_contract

    spark = shared_spark()
    now = datetime.now(UTC)
    rows = [
        (key, value, topic, 0, offset, now, [{"key": k, "value": v} for k, v in headers])
        for offset, (key, value, topic, headers) in enumerate(batch)
    ]
    read = read_contract(spark.createDataFrame(rows, RAW_SCHEMA)).withColumn(
        "quarantine_id", quarantine_id()
    )
    decided = 0
    stamp = int(now.timestamp() * 1000)
    for row in read.collect():
        key, value, topic, headers = batch[row["offset"]]
        assert row["quarantine_id"] == record_quarantine_id(topic, 0, row["offset"], key, value)
        assert row["fingerprint"] == fingerprint(stamp, key, value, headers)
        python = parse_one(topic, 0, row["offset"], key, value, headers)
        if not row["decided"]:
            continue
        decided += 1
        assert python["kind"] == "event", (
            row["offset"],
            python.get("reason"),
            batch[row["offset"]],
        )
        for jvm_name, python_name in (
            ("event_id", "event_id"),
            ("aggregate_type", "aggregate_type"),
            ("aggregate_id", "aggregate_id"),
            ("event_type", "event_type"),
            ("payload", "payload"),
            ("headers_text", "headers"),
            ("traceparent", "traceparent"),
            ("position", "position"),
            ("event_date", "event_date"),
        ):
            assert row[jvm_name] == python[python_name], (jvm_name, batch[row["offset"]])
        assert row["event_time"].replace(tzinfo=UTC) == python["event_time"]
    assert decided > 0, "no record of the batch was decided by the JVM: the draw is too broken"


def test_no_first_header_however_odd_fails_the_read() -> None:
    """Whatever the first header holds (the JVM takes a time from it), the read never
    raises: ANSI SQL refuses casts that do not fit, and conv reads "-1" as 2^64 - 1."""
    from outbox_lake.spark_contract import read_contract

    spark = shared_spark()
    now = datetime.now(UTC)
    odd = [b"-1", b"-fffffff-ffff", b"zzzzzzzz-zzzz", b"", b"\xff" * 40, b"1" * 36]
    rows = [
        (b"k", b"{}", "outbox.event.x", 0, n, now, [{"key": "retry", "value": value}])
        for n, value in enumerate(odd)
    ]
    read = read_contract(spark.createDataFrame(rows, RAW_SCHEMA)).collect()
    assert [row["decided"] for row in read] == [False] * len(odd)


def test_every_record_a_delivery_path_writes_is_decided_by_the_jvm() -> None:
    """The fast path is the common path: the contract's own records never go to Python."""
    from outbox_lake.spark_contract import read_contract

    spark = shared_spark()
    now = datetime.now(UTC)
    rows = []
    for n, payload in enumerate(['{"n": 1}', '{"total": 9.90, "items": [1, {"a": null}]}', "[1]"]):
        record = record_for(
            event_id=new_event_id(),
            aggregate_type="order",
            aggregate_id=str(n),
            event_type="Placed",
            payload_text=payload,
            headers_text='{"tenant": "a"}' if n else "{}",
            traceparent="00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01" if n else "",
            position=n + 1,
        )
        headers = [{"key": k, "value": v} for k, v in record.headers]
        rows.append((record.key, record.value, record.topic, 0, n, now, headers))
    read = read_contract(spark.createDataFrame(rows, RAW_SCHEMA))
    assert [row["decided"] for row in read.collect()] == [True, True, True]
