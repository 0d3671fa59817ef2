"""Money first seen as an integer, then as a fraction: the ``bigint`` column widens to
``decimal(38,18)`` instead of setting the fraction's row aside (pure: no Spark, no I/O;
the rewrite's retry with a stand-in for Spark)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any
from unittest import mock

import pytest

from outbox.core.payload import encode_json
from outbox_lake.typed import WIDEN_ATTEMPTS, decide_columns, widen_to_decimal, widened
from outbox_lake.typed_rows import payload_columns, type_batch, widens

TABLE = "aggregate_payment"


def event(payload: dict[str, Any] | str) -> dict[str, Any]:
    return {
        "event_id": str(uuid.uuid4()),
        "aggregate_type": "payment",
        "aggregate_id": "1",
        "event_type": "Taken",
        "position": 1,
        "event_time": datetime(2026, 11, 23, tzinfo=UTC),
        "event_date": date(2026, 11, 23),
        "payload": payload if isinstance(payload, str) else encode_json(payload),
    }


@dataclass
class Batch:
    """What the typed query does with one batch for a table that exists (``_write_type``)."""

    columns: dict[str, str]
    widened: list[str]
    landed: list[dict[str, Any]]
    """Typed rows, in the order of their commits (first pass, then the pending rows)."""
    aside: list[dict[str, Any]]


def job_batch(rows: list[dict[str, Any]], existing: dict[str, str]) -> Batch:
    first = type_batch(rows, existing, TABLE, pending=True).to_pylist()
    pending = [row for row, out in zip(rows, first, strict=True) if out["_pending"]]
    met = [  # each pending row's own fields, first appearance by offset
        (("t", 0, offset), name, kind)
        for offset, row in enumerate(pending)
        for name, kind in payload_columns(row["payload"]) or ()
    ]
    columns = decide_columns(existing, met)
    second = type_batch(pending, columns, TABLE).to_pylist() if pending else []
    typed = [out for out in first if not out["_pending"]] + second
    return Batch(
        columns=columns,
        widened=widened(existing, columns),
        landed=[out for out in typed if out["_reason"] is None],
        aside=[out for out in typed if out["_reason"] is not None],
    )


def test_a_fraction_widens_a_bigint_column_and_lands() -> None:
    rows = [event({"amount": 3}), event({"amount": Decimal("9.90")})]
    first = type_batch(rows, {"amount": "long"}, TABLE, pending=True).to_pylist()
    assert (first[0]["amount"], first[0]["_pending"]) == (3, None)  # lands in the bigint
    assert first[1]["_pending"] and first[1]["_reason"] is None  # neither typed nor aside
    batch = job_batch(rows, {"amount": "long"})
    assert batch.columns == {"amount": "decimal"} and batch.widened == ["amount"]
    assert batch.aside == []
    assert [row["amount"] for row in batch.landed] == [3, Decimal("9.90")]


def test_decimal_written_by_the_sdk_for_a_whole_amount_widens_too() -> None:
    """``Decimal("10")`` is written ``10.0``: a decimal, which a decimal column holds."""
    batch = job_batch([event({"amount": Decimal("10")})], {"amount": "long", "note": "string"})
    assert batch.widened == ["amount"] and batch.aside == []
    assert batch.landed[0]["amount"] == Decimal(10)


def test_after_widening_integers_go_into_the_decimal_column() -> None:
    batch = job_batch([event({"amount": 5}), event({"amount": -2})], {"amount": "decimal"})
    assert batch.widened == [] and batch.aside == []
    assert [row["amount"] for row in batch.landed] == [Decimal(5), Decimal(-2)]


@pytest.mark.parametrize(
    ("text", "said"),
    [
        (
            '{"amount": 0.1234567890123456789}',
            "has more than 18 digits after the point, and the column is bigint in "
            f"{TABLE}: it widens to decimal(38,18) only for a fraction that type holds "
            "exactly; round it to 18 places",
        ),
        ('{"amount": 1e25}', "is a fraction of 10^20 or more, and the column is bigint"),
        ('{"amount": 123456789012345678901.5}', "send it as a string"),
    ],
)
def test_a_fraction_no_decimal_holds_exactly_leaves_the_column_and_says_the_fix(
    text: str, said: str
) -> None:
    batch = job_batch([event('{"amount": 1}'), event(text)], {"amount": "long"})
    assert batch.columns == {"amount": "long"} and batch.widened == []
    assert [row["amount"] for row in batch.landed] == [1]
    (aside,) = batch.aside
    assert said in aside["_reason"] and "'amount'" in aside["_reason"]


def test_once_a_batch_widens_the_column_its_other_fractions_round_as_in_any_decimal() -> None:
    rows = [event('{"amount": 0.1234567890123456789}'), event('{"amount": 9.90}')]
    batch = job_batch(rows, {"amount": "long"})
    assert batch.widened == ["amount"] and batch.aside == []
    assert [row["amount"] for row in batch.landed] == [
        Decimal("0.123456789012345679"),
        Decimal("9.90"),
    ]
    beyond = job_batch([event('{"amount": 1e25}'), event('{"amount": 9.90}')], {"amount": "long"})
    assert "does not fit the column's decimal(38,18)" in beyond.aside[0]["_reason"]


def test_a_field_differing_in_case_from_a_bigint_column_widens_nothing() -> None:
    batch = job_batch([event({"Amount": Decimal("9.90")})], {"amount": "long"})
    assert batch.columns == {"amount": "long"} and batch.widened == []
    assert "differs only in case from the column 'amount'" in batch.aside[0]["_reason"]


def test_rows_typed_at_once_and_rows_with_a_new_field_share_the_widening() -> None:
    rows = [
        event({"amount": 1, "note": "a"}),
        event({"amount": Decimal("0.50"), "note": "b"}),
        event({"amount": 2, "coupon": "X"}),
    ]
    batch = job_batch(rows, {"amount": "long", "note": "string"})
    assert batch.columns == {"amount": "decimal", "note": "string", "coupon": "string"}
    assert sorted(row["amount"] for row in batch.landed) == [Decimal("0.50"), 1, 2]
    assert sum(Decimal(row["amount"]) for row in batch.landed) == Decimal("3.50")


def test_which_kinds_widen_a_column() -> None:
    assert widens("long", "decimal")
    for column, kind in [
        ("long", "double"),  # a double column would make money sums inexact
        ("long", "string"),
        ("decimal", "long"),  # already wide enough: an integer fits
        ("double", "decimal"),
        ("decimal", "double"),
        ("string", "decimal"),
        ("boolean", "decimal"),
        (None, "decimal"),
    ]:
        assert not widens(column, kind), (column, kind)


def test_columns_decided_for_a_batch_widen_only_a_bigint_met_with_a_decimal() -> None:
    existing = {"amount": "long", "ratio": "double", "count": "long", "price": "decimal"}
    met = [
        (("t", 0, 1), "amount", "long"),
        (("t", 0, 2), "amount", "decimal"),
        (("t", 0, 3), "ratio", "decimal"),
        (("t", 0, 4), "count", "double"),
        (("t", 0, 5), "price", "long"),
        (("t", 0, 6), "AMOUNT", "decimal"),
    ]
    columns = decide_columns(existing, met)
    assert columns == {"amount": "decimal", "ratio": "double", "count": "long", "price": "decimal"}
    assert widened(existing, columns) == ["amount"]
    # a new field in one batch: first an integer, then a fraction: decimal at once
    new = decide_columns({}, [(("t", 0, 9), "total", "decimal"), (("t", 0, 1), "total", "long")])
    assert new == {"total": "decimal"}
    # first a fraction, then an integer: decimal as before
    assert decide_columns({}, [(("t", 0, 1), "t", "decimal"), (("t", 0, 2), "t", "long")]) == {
        "t": "decimal"
    }


class _Conflict(Exception):
    pass


def _stand_in(failures: list[Exception | None]) -> tuple[mock.MagicMock, mock.MagicMock]:
    """A Spark session whose table has ``amount`` and ``note``, and whose overwrite raises
    ``failures`` in turn (None: it commits)."""
    spark = mock.MagicMock()
    table = spark.read.format.return_value.load.return_value
    table.columns = ["event_id", "event_date", "amount", "fee.net"]
    writer = table.select.return_value.write.format.return_value.mode.return_value
    save = writer.option.return_value.partitionBy.return_value.save
    save.side_effect = failures
    return spark, save


def test_the_rewrite_is_one_overwrite_that_casts_only_the_widened_columns() -> None:
    spark, save = _stand_in([None])
    col = mock.MagicMock(name="col")
    with mock.patch("pyspark.sql.functions.col", col):
        widen_to_decimal(spark, "/lake/aggregate_payment", ["amount"])
    assert save.call_args_list == [mock.call("/lake/aggregate_payment")]
    assert [call.args[0] for call in col.call_args_list] == [
        "`event_id`",
        "`event_date`",
        "`amount`",
        "`fee.net`",
    ]
    col.return_value.cast.assert_called_once_with("decimal(38,18)")
    col.return_value.cast.return_value.alias.assert_called_once_with("amount")
    table = spark.read.format.return_value.load.return_value
    writer = table.select.return_value.write.format.return_value.mode
    writer.assert_called_once_with("overwrite")
    writer.return_value.option.assert_called_once_with("overwriteSchema", "true")
    writer.return_value.option.return_value.partitionBy.assert_called_once_with("event_date")


def test_a_rewrite_that_meets_a_concurrent_commit_is_tried_again() -> None:
    conflict = _Conflict("[DELTA_CONCURRENT_DELETE_READ] a concurrent update (compaction)")
    spark, save = _stand_in([conflict, None])
    with mock.patch("pyspark.sql.functions.col", mock.MagicMock()):
        widen_to_decimal(spark, "/lake/t", ["amount"])
    assert save.call_count == 2
    assert spark.read.format.return_value.load.call_count == 2  # the table read again

    spark, save = _stand_in([conflict] * WIDEN_ATTEMPTS)
    with (
        mock.patch("pyspark.sql.functions.col", mock.MagicMock()),
        pytest.raises(_Conflict),
    ):
        widen_to_decimal(spark, "/lake/t", ["amount"])
    assert save.call_count == WIDEN_ATTEMPTS

    spark, save = _stand_in([RuntimeError("disk full")])
    with mock.patch("pyspark.sql.functions.col", mock.MagicMock()), pytest.raises(RuntimeError):
        widen_to_decimal(spark, "/lake/t", ["amount"])
    assert save.call_count == 1  # anything else is not tried again
