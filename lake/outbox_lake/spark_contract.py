"""The event contract read by Spark's built-in functions: no Python on the hot path.

Every record of a micro-batch is read here by the JVM. A record that follows the contract as
every delivery path writes it (the five headers ``id``, ``eventType``, ``traceparent``,
``headers``, ``position`` in that order, a canonical UUIDv7 id, UTF-8 everywhere, a JSON
value) is *decided* here: its event columns come out. Anything else (a tombstone, another
header layout, an id in another spelling, bytes that are not UTF-8, a JSON text Spark's
parser will not vouch for, a time no calendar holds) is left *undecided* and goes, alone, to
the Python contract (:func:`outbox.core.contract.parse_record` through
:func:`outbox_lake.records.parse_batch`), which stays the one definition of the contract: it
makes the event or the quarantine row with its reason.

So the JVM path only ever says "yes" where the Python contract says "yes" with the same
columns; a property test draws records (valid, malformed, raw bytes, odd headers) and checks
exactly that (tests/integration/test_lake_contract_paths.py).

JSON validity, the one subtle part: Spark's JSON functions read one value and ignore what
follows it (``{} x`` parses). A text ``v`` is vouched for when ``{"a":v}`` parses with the
strict parser of ``parse_json`` and ``[v]`` is an array of exactly one element
(``json_array_length``): the strict parse makes ``v`` start with a valid JSON value followed
by nothing, ``,`` or ``}``; a ``}`` cannot close the array, and a ``,`` gives it a second
element. ``parse_json`` also refuses duplicate object keys, lone surrogates and nesting
beyond 1,000 levels, which Python accepts: those records are undecided and Python decides
them. (Pure: builds column expressions, runs nothing.)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from outbox.core.contract import (
    HEADER_EVENT_TYPE,
    HEADER_HEADERS,
    HEADER_ID,
    HEADER_POSITION,
    HEADER_TRACEPARENT,
    TOPIC_PREFIX,
)

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

__all__ = [
    "CONTRACT_HEADERS",
    "EVENT_FIELDS",
    "RAW_FIELDS",
    "contract_columns",
    "fingerprint",
    "read_contract",
    "sql_text",
    "vouched_object",
]

CONTRACT_HEADERS = (
    HEADER_ID,
    HEADER_EVENT_TYPE,
    HEADER_TRACEPARENT,
    HEADER_HEADERS,
    HEADER_POSITION,
)
"""The headers of a contract record, in the order every delivery path writes them."""

RAW_FIELDS = ("key", "value", "topic", "partition", "offset", "timestamp", "headers")
"""The columns of Spark's Kafka source the lake reads."""

EVENT_FIELDS = (
    "event_id",
    "aggregate_type",
    "aggregate_id",
    "event_type",
    "payload",
    "headers_text",
    "traceparent",
    "position",
    "event_time",
    "event_date",
)
"""What a decided record gives (``headers_text``: the ``headers`` header's JSON text)."""

_UUID7 = "^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$"
_YEAR_10000_MS = 253_402_300_800_000
"""Python's datetime ends with the year 9999: a later UUIDv7 time is left to Python."""


def sql_text(value: str) -> str:
    """``value`` as a Spark SQL string literal."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _vouched_json(text: str) -> str:
    """SQL: ``text`` (a string expression) is one JSON value, nothing after it."""
    return (
        f"(try_parse_json('{{\"a\":' || {text} || '}}') IS NOT NULL"
        f" AND json_array_length('[' || {text} || ']') = 1)"
    )


def vouched_object(text: str) -> str:
    """SQL: ``text`` is one JSON object, nothing after it."""
    return f"({_vouched_json(text)} AND json_object_keys({text}) IS NOT NULL)"


def _millis(event_id: str) -> str:
    """SQL: the UUIDv7's time in milliseconds (its first 48 bits: 8 + 4 hex digits), NULL
    when those are not hex digits (``conv`` reads ``-1`` as a huge unsigned number, which a
    plain cast would refuse, stopping the batch)."""
    text = f"CAST({event_id} AS string)"
    digits = f"substr({text}, 1, 8) || substr({text}, 10, 4)"
    return (
        f"CASE WHEN regexp_like({digits}, '^[0-9a-f]{{12}}$')"
        f" THEN try_cast(conv({digits}, 16, 10) AS bigint) END"
    )


def _header(index: int) -> str:
    """SQL: the value of the record's ``index``-th header (NULL when it has fewer: ANSI SQL
    would raise on ``headers[i]``)."""
    return f"get(headers, {index}).value"


def _conditions() -> list[str]:
    """What a record must be for the JVM to decide it (each a SQL boolean)."""
    names = " AND ".join(
        f"get(headers, {i}).key = {sql_text(name)}" for i, name in enumerate(CONTRACT_HEADERS)
    )
    event_id, event_type, traceparent, extra, position = (_header(i) for i in range(5))
    return [
        f"startswith(topic, {sql_text(TOPIC_PREFIX)})",
        f"size(headers) = {len(CONTRACT_HEADERS)}",
        names,
        f"{event_id} IS NOT NULL AND regexp_like(CAST({event_id} AS string), {sql_text(_UUID7)})",
        f"{_millis(event_id)} < {_YEAR_10000_MS}",
        f"{event_type} IS NOT NULL AND length({event_type}) > 0 AND is_valid_utf8({event_type})",
        f"({traceparent} IS NULL OR is_valid_utf8({traceparent}))",
        f"({extra} IS NULL OR length({extra}) = 0 OR (is_valid_utf8({extra})"
        f" AND {vouched_object(f'CAST({extra} AS string)')}))",
        f"({position} IS NULL OR (regexp_like(CAST({position} AS string), '^[0-9]{{1,19}}$')"
        f" AND try_cast(CAST({position} AS string) AS bigint) IS NOT NULL))",
        "(key IS NULL OR is_valid_utf8(key))",
        "value IS NOT NULL AND is_valid_utf8(value)",
        _vouched_json("CAST(value AS string)"),
    ]


def _event_columns() -> list[tuple[str, str]]:
    event_id, event_type, traceparent, extra, position = (_header(i) for i in range(5))
    millis = _millis(event_id)
    in_range = f"{millis} BETWEEN 0 AND {_YEAR_10000_MS}"
    return [
        ("event_id", f"CAST({event_id} AS string)"),
        ("aggregate_type", f"substr(topic, {len(TOPIC_PREFIX) + 1})"),
        ("aggregate_id", "coalesce(CAST(key AS string), '')"),
        ("event_type", f"CAST({event_type} AS string)"),
        ("payload", "CAST(value AS string)"),
        (
            "headers_text",
            f"CASE WHEN {extra} IS NULL OR length({extra}) = 0 THEN '{{}}'"
            f" ELSE CAST({extra} AS string) END",
        ),
        (
            "traceparent",
            f"CASE WHEN {traceparent} IS NULL OR length({traceparent}) = 0 THEN NULL"
            f" ELSE CAST({traceparent} AS string) END",
        ),
        ("position", f"try_cast(CAST({position} AS string) AS bigint)"),
        ("event_time", f"CASE WHEN {in_range} THEN timestamp_millis({millis}) END"),
        ("event_date", f"CASE WHEN {in_range} THEN to_date(timestamp_millis({millis})) END"),
    ]


def decided() -> Column:
    """The column that says a record is decided by the JVM path."""
    from pyspark.sql import functions as f

    return f.expr(" AND ".join(f"coalesce({c}, false)" for c in _conditions()))


def fingerprint() -> Column:
    """:func:`outbox_lake.offsets.fingerprint` in Spark's functions: the record's timestamp
    (ms) and the CRC-32 of its key, value, and each header's name and value, in order (a
    running CRC over parts is the CRC of their concatenation)."""
    from pyspark.sql import functions as f

    content = (
        "concat(coalesce(key, X''), coalesce(value, X''), aggregate(coalesce(headers, array()), "
        "X'', (acc, h) -> concat(acc, encode(coalesce(h.key, ''), 'UTF-8'), "
        "coalesce(h.value, X''))))"
    )
    crc = f"lpad(lower(hex(crc32({content}))), 8, '0')"
    return f.expr(f"concat(coalesce(unix_millis(timestamp), 0), '-', {crc})")


def contract_columns() -> list[Column]:
    """The columns :func:`read_contract` adds (build once, use for every batch: parsing
    the expressions costs more than a small batch's work)."""
    from pyspark.sql import functions as f

    return [
        decided().alias("decided"),
        *(f.expr(sql).alias(name) for name, sql in _event_columns()),
        fingerprint().alias("fingerprint"),
    ]


def read_contract(raw: DataFrame, columns: list[Column] | None = None) -> DataFrame:
    """``raw`` (Spark's Kafka source's :data:`RAW_FIELDS`) with ``decided``,
    :data:`EVENT_FIELDS` (which mean something only where ``decided`` is true: each is
    computed without raising whatever the record holds, and is read only there) and the
    record's ``fingerprint``."""
    return raw.select(*RAW_FIELDS, *(columns or contract_columns()))
