"""Payload encoding: round trips, special types, and errors that name the field."""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import json
import math
import uuid
from decimal import Decimal
from typing import Any

import pydantic
import pytest
from hypothesis import given
from hypothesis import strategies as st

from outbox.core.errors import PayloadTooLargeError, PayloadTypeError
from outbox.core.payload import encode_json

# Text that jsonb can store: no NUL, no lone surrogates.
storable_text = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00")
)
json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63)
    | st.floats(allow_nan=False, allow_infinity=False)
    | storable_text
)
json_values = st.recursive(
    json_scalars,
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(storable_text, children, max_size=5)
    ),
    max_leaves=30,
)


@given(json_values)
def test_json_values_round_trip_unchanged(value: Any) -> None:
    assert json.loads(encode_json(value)) == value


class Colour(enum.Enum):
    RED = "red"


class Size(enum.IntEnum):
    LARGE = 3


@dataclasses.dataclass
class Line:
    sku: str
    price: Decimal
    at: dt.date


class Customer(pydantic.BaseModel):
    id: uuid.UUID
    since: dt.datetime


def _written_out_digits(value: Decimal) -> int:
    exponent = value.as_tuple().exponent
    assert isinstance(exponent, int)
    return len(value.as_tuple().digits) + abs(exponent)


@given(
    st.decimals(allow_nan=False, allow_infinity=False).filter(
        lambda d: _written_out_digits(d) <= 1000
    )
)
def test_decimals_are_exact_json_numbers_with_a_decimal_point(value: Decimal) -> None:
    text = encode_json({"amount": value, "note": "\\u0000 1.5"})
    decoded = json.loads(text, parse_float=Decimal)
    assert decoded["note"] == "\\u0000 1.5"  # a string that looks like the marker stays one
    amount = decoded["amount"]
    assert isinstance(amount, Decimal), text  # a number with a point: never read as an int
    assert amount == value
    assert amount.as_tuple().exponent == min(value.as_tuple().exponent, -1)  # same digits


def test_no_string_becomes_a_number() -> None:
    from outbox.core.payload import encode_parsed_json

    class Sly(str):
        def __str__(self) -> str:
            return "\x0012.5"

    assert encode_json({"a": Sly("x"), "b": Decimal("1")}) == '{"a":"x","b":1.0}'
    # JSON from another producer may hold NUL: never taken for one of the SDK's numbers.
    assert encode_parsed_json({"x": "\x001.5"}) == '{"x":"\\u00001.5"}'
    with pytest.raises(ValueError, match="NUL character followed by a number"):
        encode_parsed_json({"x": "\x001.5", "y": Decimal("2.5")})
    assert encode_parsed_json([Decimal("2.50"), {"z": Decimal("-1E+2")}]) == '[2.50,{"z":-100.0}]'


def test_a_decimal_too_long_to_write_out_is_refused_naming_the_field() -> None:
    with pytest.raises(PayloadTypeError, match=r"payload.big is Decimal\('1E\+5000'\)"):
        encode_json({"big": Decimal("1E+5000")})
    assert encode_json([Decimal("12"), Decimal("-0.50"), Decimal("1E+3")]) == "[12.0,-0.50,1000.0]"


@given(st.datetimes(timezones=st.none() | st.timezones()), st.dates(), st.uuids())
def test_dates_times_and_uuids_round_trip_through_iso_text(
    moment: dt.datetime, day: dt.date, identifier: uuid.UUID
) -> None:
    decoded = json.loads(encode_json({"at": moment, "day": day, "id": identifier}))
    parsed = dt.datetime.fromisoformat(decoded["at"])
    # Wall time and offset, compared apart: aware datetimes in a DST fold never compare equal
    # across zones (PEP 495), though they name the same instant.
    assert parsed.replace(tzinfo=None) == moment.replace(tzinfo=None)
    assert parsed.utcoffset() == moment.utcoffset()
    assert dt.date.fromisoformat(decoded["day"]) == day
    assert uuid.UUID(decoded["id"]) == identifier


def test_enums_dataclasses_and_pydantic_models() -> None:
    customer_id = uuid.uuid4()
    since = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
    payload = {
        "colour": Colour.RED,
        "size": Size.LARGE,
        "lines": (Line("a-1", Decimal("9.90"), dt.date(2026, 11, 23)),),
        "customer": Customer(id=customer_id, since=since),
    }
    assert json.loads(encode_json(payload)) == {
        "colour": "red",
        "size": 3,
        "lines": [{"sku": "a-1", "price": 9.90, "at": "2026-11-23"}],
        "customer": {"id": str(customer_id), "since": "2026-01-02T03:04:05Z"},
    }


# A path made of dict keys and list indexes, and the value placed there.
path_steps = st.lists(
    st.one_of(st.from_regex(r"[a-z]{1,6}", fullmatch=True), st.integers(0, 3)), max_size=5
)
unencodable = st.sampled_from(
    [object(), {1, 2}, b"bytes", complex(1, 2), math.nan, Decimal("NaN"), "a\x00b", "\ud800"]
)


@given(path_steps, unencodable)
def test_an_unencodable_value_is_refused_naming_its_path(
    steps: list[str | int], bad: object
) -> None:
    value: Any = bad
    expected_path = "payload"
    for step in reversed(steps):
        value = [None] * step + [value] if isinstance(step, int) else {step: value}
    for step in steps:
        expected_path += f"[{step}]" if isinstance(step, int) else f".{step}"
    with pytest.raises(PayloadTypeError) as raised:
        encode_json(value)
    assert raised.value.path == expected_path
    assert expected_path in str(raised.value)
    assert isinstance(raised.value, TypeError)


def test_non_string_keys_are_refused() -> None:
    with pytest.raises(PayloadTypeError, match=r"payload\.items has the key 1 of type int"):
        encode_json({"items": {1: "a"}})


def test_dataclass_field_is_named_in_the_path() -> None:
    @dataclasses.dataclass
    class Holder:
        inner: object

    with pytest.raises(PayloadTypeError) as raised:
        encode_json({"x": [Holder(inner={1, 2})]})
    assert raised.value.path == "payload.x[0].inner"


def test_payload_over_the_limit_is_refused_with_its_size() -> None:
    with pytest.raises(PayloadTooLargeError, match="OUTBOX_MAX_PAYLOAD_BYTES") as raised:
        encode_json({"blob": "é" * 600}, max_bytes=1000)
    assert raised.value.size == len('{"blob":""}') + 1200
    assert raised.value.limit == 1000
    assert encode_json({"blob": "é" * 400}, max_bytes=1000)


# Anything a payload may hold, storable or not: NUL, lone surrogates, NaN, non-str keys,
# tuples, special types; the fast path must give the walk's text or the walk's error.
any_text = st.text(alphabet=st.characters(), max_size=8) | st.sampled_from(
    ["a\x00b", "\ud800", "\\u0000"]
)
any_scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | any_text
    | st.decimals(allow_nan=False)
    | st.uuids()
)
any_values = st.recursive(
    any_scalars,
    lambda children: (
        st.lists(children, max_size=4)
        | st.tuples(children, children)
        | st.dictionaries(any_text | st.integers(), children, max_size=4)
    ),
    max_leaves=20,
)


def _walked(value: Any) -> str | type[Exception]:
    from outbox.core.payload import _walked_text

    try:
        text = _walked_text(value, "payload")
        text.encode("utf-8")
    except (PayloadTypeError, UnicodeEncodeError) as error:
        return type(error)
    return text


@given(st.dictionaries(any_text | st.integers() | st.booleans(), any_values, max_size=5))
def test_the_fast_path_gives_the_walks_text_or_its_error(payload: dict[Any, Any]) -> None:
    expected = _walked(payload)
    try:
        got: str | type[Exception] = encode_json(payload)
        got.encode("utf-8")
    except (PayloadTypeError, UnicodeEncodeError) as error:
        got = type(error)
    assert got == expected


def test_a_payload_nested_as_deep_as_the_walk_allows_still_encodes() -> None:
    """The fast path's type walk gives up on deep nesting (RecursionError) and leaves it
    to the walk, which has the whole stack: 400 levels encode, as they did before it."""
    payload: dict[str, Any] = {}
    level = payload
    for _ in range(400):
        level["a"] = {}
        level = level["a"]
    assert encode_json(payload) == '{"a":' * 400 + "{}" + "}" * 400
