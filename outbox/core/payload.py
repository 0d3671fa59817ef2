"""Encoding of event payloads (and headers) to the JSON text stored in the outbox.

What is accepted, and how it is written:

========================  ==================================================
Python value               JSON
========================  ==================================================
``None``, ``bool``         ``null``, ``true``/``false``
``int``                    number
``float`` (finite)         number; ``nan`` and ``inf`` are refused
``str``                    string; NUL characters and lone surrogates are refused
                           (PostgreSQL's ``jsonb`` cannot store them)
``Decimal`` (finite)       number with the exact digits and a decimal point, e.g.
                           ``12.30``, ``12.0`` for ``Decimal("12")`` (so a reader
                           tells it from an integer); at most 1000 digits
``datetime``, ``date``,    ISO 8601 string (``datetime.isoformat()``)
``time``
``UUID``                   string in canonical form
``Enum``                   its ``value``, encoded by these same rules
dataclass instance         object of its fields
pydantic model             ``model_dump(mode="json")``
``dict`` with ``str`` keys object
``list``, ``tuple``        array
========================  ==================================================

Anything else raises :class:`PayloadTypeError` whose message and ``path`` name the field,
for example ``payload.items[2].price``.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import json
import math
import re
import uuid
from collections.abc import Callable, Mapping, Sequence
from decimal import Decimal
from typing import Any

from outbox.core.errors import PayloadTooLargeError, PayloadTypeError

__all__ = ["JsonValue", "encode_json", "encode_parsed_json", "to_json_value"]

# One encoder for the process: json.dumps with options builds a new one on every call.
_ENCODER = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))
# The same encoder's C core, made once (JSONEncoder.encode makes it anew on every call). No
# circular-reference markers: the fast path's type walk has already seen every container.
_c_make_encoder = getattr(json.encoder, "c_make_encoder", None)
_ENCODE_PLAIN: Callable[[Any, int], Sequence[str]] = (
    _c_make_encoder(
        None, _ENCODER.default, json.encoder.encode_basestring, None, ":", ",", False, False, False
    )
    if _c_make_encoder is not None
    else lambda value, _level: (_ENCODER.encode(value),)
)

JsonValue = None | bool | int | float | str | list["JsonValue"] | dict[str, "JsonValue"]

# A Decimal leaves the walk as a NUL character and its digits, a string no payload can hold
# (text with NUL is refused): the encoder writes it as "\u0000<digits>", and the quotes and the
# marker are then taken off, leaving the exact number.
_DECIMAL_MARK = "\x00"
_DECIMAL_TEXT = re.compile(r'"\\u0000(-?[0-9]+\.[0-9]+)"')
_MAX_DECIMAL_DIGITS = 1000


def encode_json(value: object, *, root: str = "payload", max_bytes: int | None = None) -> str:
    """Encode ``value`` to compact JSON text; refuse it if larger than ``max_bytes`` (UTF-8)."""
    text = _encode_plain(value)
    if text is None:  # not plain JSON types, or a value to refuse: the walk names the field
        text = _walked_text(value, root)
    if max_bytes is not None:
        # A str's UTF-8 size is at most 4 bytes per character: skip the encode when it fits anyway.
        size = len(text) if text.isascii() else len(text.encode("utf-8"))
        if size > max_bytes:
            raise PayloadTooLargeError(
                f"{root} is {size} bytes of JSON, over the limit of {max_bytes} bytes: "
                "send a reference to the data instead, or raise OUTBOX_MAX_PAYLOAD_BYTES",
                size=size,
                limit=max_bytes,
            )
    return text


def _walked_text(value: object, root: str) -> str:
    """The walk's text: every value converted (or refused naming its field), then encoded,
    its Decimals written as exact numbers."""
    text = _ENCODER.encode(to_json_value(value, root))
    if "\\u0000" in text:  # the walk's Decimals (no text with NUL passes the walk)
        text = _DECIMAL_TEXT.sub(r"\1", text)
    return text


_PLAIN_SCALARS = frozenset({str, int, float, bool, type(None)})


def _encode_plain(value: object) -> str | None:
    """The fast path, with the walk's text: a dict of plain JSON types (str keys; str, int,
    float, bool, None, dict and list values) goes straight to the C encoder, and the text is
    checked for what the walk refuses (NaN and infinities raise in the encoder; a NUL
    character shows as an escaped u0000; a lone surrogate fails UTF-8 encoding). ``None``
    when anything is off: then the walk converts the value, or raises naming the field."""
    try:
        if type(value) is not dict or not _is_plain_dict(value):
            return None
        text = "".join(_ENCODE_PLAIN(value, 0))
    except ValueError:  # NaN or an infinity
        return None
    except RecursionError:  # deep nesting: the walk, with the whole stack, decides
        return None
    if "\\u0000" in text:
        return None
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            return None
    return text


def _is_plain_dict(value: dict[Any, Any]) -> bool:
    # A loop, scalars judged inline: a flat payload (the usual one) costs no call per field.
    for key, item in value.items():
        if type(key) is not str:
            return False
        if type(item) not in _PLAIN_SCALARS and not _is_plain(item):
            return False
    return True


def _is_plain(item: object) -> bool:
    kind = type(item)
    if kind is dict:
        return _is_plain_dict(item)  # type: ignore[arg-type]
    if kind is list:
        return all(map(_is_plain, item))  # type: ignore[call-overload]
    return kind in _PLAIN_SCALARS


def encode_parsed_json(value: Any) -> str:
    """Compact JSON text of a value parsed from JSON with ``parse_float=Decimal``: its
    ``Decimal`` numbers written exactly. Raises ``ValueError`` or ``TypeError`` (a NaN, a
    type JSON does not have, a string that holds the number marker: text parsed from a
    producer other than the SDK may hold NUL), ``RecursionError`` (nesting too deep)."""
    marked = 0

    def mark(item: object) -> str:
        nonlocal marked
        if isinstance(item, Decimal) and item.is_finite():
            marked += 1
            return _DECIMAL_MARK + _decimal_text(item, "a value")
        raise TypeError(f"{type(item).__name__} is not JSON")

    encoder = json.JSONEncoder(
        ensure_ascii=False, allow_nan=False, separators=(",", ":"), default=mark
    )
    text = encoder.encode(value)
    if not marked:
        return text
    text, found = _DECIMAL_TEXT.subn(r"\1", text)
    if found != marked:
        raise ValueError("a string holds a NUL character followed by a number")
    return text


def to_json_value(value: object, path: str = "payload") -> JsonValue:
    """Convert ``value`` to plain JSON types, or raise naming the path of the bad field
    (a ``Decimal`` becomes a marked string that :func:`encode_json` writes as a number)."""
    # Exact built-in types first, without isinstance: this runs for every field of every event.
    if type(value) is str:
        _check_text(value, path)
        return value
    if value is None or type(value) is int or type(value) is bool:
        return value
    if type(value) is dict:
        return _mapping_to_json(value, path)
    if type(value) is float:
        return _finite(value, path)
    if type(value) is list or type(value) is tuple:
        return [to_json_value(item, f"{path}[{index}]") for index, item in enumerate(value)]
    return _subclass_to_json(value, path)


def _subclass_to_json(value: object, path: str) -> JsonValue:
    """Subclasses of the built-in types (enums first), and the special types."""
    if isinstance(value, enum.Enum):
        return to_json_value(value.value, path)
    if isinstance(value, str):
        _check_text(value, path)
        return str.__str__(value)  # its text, whatever the subclass's __str__ says
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return _finite(float(value), path)
    if isinstance(value, Mapping):
        return _mapping_to_json(value, path)
    if isinstance(value, list | tuple):
        return [to_json_value(item, f"{path}[{index}]") for index, item in enumerate(value)]
    return _special_to_json(value, path)


def _finite(value: float, path: str) -> float:
    if not math.isfinite(value):
        raise PayloadTypeError(
            f"{path} is {value!r}, which JSON cannot represent: use a finite number or None",
            path=path,
        )
    return value


def _mapping_to_json(value: Mapping[Any, Any], path: str) -> dict[str, JsonValue]:
    result: dict[str, JsonValue] = {}
    for key, item in value.items():
        if not isinstance(key, str):
            raise PayloadTypeError(
                f"{path} has the key {key!r} of type {type(key).__name__}: "
                "JSON object keys must be str",
                path=path,
            )
        _check_text(key, f"{path} key {key!r}")
        result[key] = to_json_value(item, f"{path}.{key}")
    return result


def _special_to_json(value: object, path: str) -> JsonValue:
    if isinstance(value, Decimal):
        if not value.is_finite():
            raise PayloadTypeError(
                f"{path} is Decimal({str(value)!r}), which JSON cannot represent", path=path
            )
        return _DECIMAL_MARK + _decimal_text(value, path)
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, uuid.UUID):
        return str(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {
            field.name: to_json_value(getattr(value, field.name), f"{path}.{field.name}")
            for field in dataclasses.fields(value)
        }
    model_dump = getattr(value, "model_dump", None)
    if callable(model_dump) and hasattr(type(value), "model_fields"):
        # A pydantic model: let it apply its own serialisers, then check the result.
        return to_json_value(model_dump(mode="json"), path)
    raise PayloadTypeError(
        f"{path} is of type {type(value).__module__}.{type(value).__qualname__}, which the "
        "outbox cannot encode as JSON: convert it to str, int, float, bool, None, dict, list, "
        "Decimal, datetime, date, time, UUID, an Enum, a dataclass or a pydantic model",
        path=path,
    )


def _decimal_text(value: Decimal, path: str) -> str:
    """The exact digits, in plain notation, with a decimal point."""
    digits = len(value.as_tuple().digits)
    exponent = value.as_tuple().exponent
    assert isinstance(exponent, int)  # finite
    if digits + abs(exponent) > _MAX_DECIMAL_DIGITS:
        raise PayloadTypeError(
            f"{path} is Decimal({str(value)!r}), over {_MAX_DECIMAL_DIGITS} digits written "
            "out: send it as a string",
            path=path,
        )
    text = format(value, "f")
    return text if "." in text else text + ".0"


def _check_text(text: str, path: str) -> None:
    if text.isascii():
        if "\x00" in text:
            raise PayloadTypeError(
                f"{path} contains a NUL character (\\x00), which PostgreSQL's jsonb cannot "
                "store: remove it or encode the value (for example base64)",
                path=path,
            )
        return
    if "\x00" in text:
        raise PayloadTypeError(f"{path} contains a NUL character (\\x00)", path=path)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise PayloadTypeError(
            f"{path} contains a lone surrogate ({error.object[error.start]!r}), "
            "which is not valid Unicode text",
            path=path,
        ) from error
