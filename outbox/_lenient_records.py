"""A narrow adapter over kafka-python's record parsing: a header name that is not UTF-8 no
longer stops a consumer.

Kafka's protocol carries a header name as bytes, and Apache Kafka accepts any bytes there
(Java clients decode them leniently). kafka-python 3.0 decodes each name with
``bytes.decode("utf-8")`` inside ``DefaultRecordBatch._read_msg``: one such record makes
``poll()`` raise ``CorruptRecordError``, and the next ``poll()`` spins on the same batch for
ever. Seeking past the record does not help: a fetch returns the whole batch again, and every
record of it is parsed before the ones below the position are dropped.

:func:`install` gives one consumer (never kafka-python as a whole: other consumers in the
process are untouched) a parser that reads such a record like any other, with its header
names escaped (``\\xff``) in a list that carries ``problem``: the reason. The record then
travels through kafka-python unchanged (positions, transactions, aborted batches, offsets
commits all as usual), and :mod:`outbox.kafka_reading` turns it into a
:class:`~outbox.core.kafka_record.KafkaRecord` whose ``unreadable`` says why.

It reaches into three private parts of kafka-python (``KafkaConsumer._fetcher``,
``Fetcher.PartitionRecords``, ``DefaultRecordBatch._read_msg``): kafka-python is pinned in
pyproject.toml, :func:`install` refuses a consumer that lacks them, and
tests/unit/test_kafka_reading.py runs the real classes over crafted bytes.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from outbox.core.errors import ConfigurationError

__all__ = ["HeaderNames", "install"]


class HeaderNames(list[tuple[str, bytes | None]]):
    """A record's headers, one of whose names is not UTF-8: the names are escaped, and
    ``problem`` says which one was not."""

    __slots__ = ("problem",)

    def __init__(self, headers: list[tuple[str, bytes | None]], problem: str) -> None:
        super().__init__(headers)
        self.problem = problem


def _problem(bad: list[tuple[int, bytes, UnicodeDecodeError]], count: int) -> str:
    index, raw, error = bad[0]
    more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
    return (
        f"header name {raw[:40]!r} (header {index + 1} of {count}) is not UTF-8 "
        f"({error.reason} at byte {error.start}){more}: no reader of ours can take the "
        "record at its word"
    )


@cache
def _classes(partition_records: type) -> type:
    """The lenient ``PartitionRecords`` for kafka-python's own (built once, on first use:
    importing this module imports no kafka)."""
    from kafka.errors import CorruptRecordError
    from kafka.record.default_records import DefaultRecord, DefaultRecordBatch
    from kafka.record.util import decode_varint

    def sized(buffer: Any, pos: int) -> tuple[bytes | None, int]:
        length, pos = decode_varint(buffer, pos)
        if length < 0:
            return None, pos
        return bytes(buffer[pos : pos + length]), pos + length

    class LenientBatch(DefaultRecordBatch):  # type: ignore[misc]
        __slots__ = ()

        def _read_msg(self, *args: Any, **kwargs: Any) -> Any:
            batch: Any = self  # kafka-python is untyped: its attributes are Any
            start: int = batch._pos
            try:
                return super()._read_msg(*args, **kwargs)
            except UnicodeDecodeError:
                batch._pos = start  # kafka-python moves it only once a record is read
                return read_with_raw_names(batch)

    def read_with_raw_names(batch: Any) -> Any:
        """kafka-python's ``_read_msg``, the header names kept when not UTF-8."""
        buffer = batch._buffer
        length, pos = decode_varint(buffer, batch._pos)
        body = pos
        _, pos = decode_varint(buffer, pos)  # attributes: unused
        delta, pos = decode_varint(buffer, pos)
        if batch.timestamp_type == batch.LOG_APPEND_TIME:
            timestamp = batch.max_timestamp
        else:
            timestamp = batch.first_timestamp + delta
        offset_delta, pos = decode_varint(buffer, pos)
        key, pos = sized(buffer, pos)
        value, pos = sized(buffer, pos)
        count, pos = decode_varint(buffer, pos)
        if count < 0:
            raise CorruptRecordError(f"Found invalid number of record headers {count}")
        headers: list[tuple[str, bytes | None]] = []
        bad: list[tuple[int, bytes, UnicodeDecodeError]] = []
        for index in range(count):
            name_length, pos = decode_varint(buffer, pos)
            if name_length < 0:
                raise CorruptRecordError(f"Invalid negative header key size {name_length}")
            raw = bytes(buffer[pos : pos + name_length])
            pos += name_length
            data, pos = sized(buffer, pos)
            try:
                name = raw.decode("utf-8")
            except UnicodeDecodeError as error:
                name = raw.decode("utf-8", "backslashreplace")
                bad.append((index, raw, error))
            headers.append((name, data))
        if pos - body != length:
            raise CorruptRecordError(
                f"Invalid record size: expected to read {length} bytes in record "
                f"payload, but instead read {pos - body}"
            )
        batch._pos = pos
        return DefaultRecord(
            length,
            batch.base_offset + offset_delta,
            timestamp,
            batch.timestamp_type,
            key,
            value,
            HeaderNames(headers, _problem(bad, count)) if bad else headers,
        )

    class LenientRecords:
        """kafka-python's ``MemoryRecords``, its v2 batches parsed by ``LenientBatch``."""

        def __init__(self, records: Any) -> None:
            self._records = records

        def next_batch(self, *args: Any, **kwargs: Any) -> Any:
            batch = self._records.next_batch(*args, **kwargs)
            if type(batch) is DefaultRecordBatch:
                batch.__class__ = LenientBatch  # same layout: no copy of the batch
            return batch

        def __getattr__(self, name: str) -> Any:
            return getattr(self._records, name)

    class LenientPartitionRecords(partition_records):  # type: ignore[misc]
        def __init__(self, fetch_offset: int, tp: Any, records: Any, *args: Any, **kw: Any):
            super().__init__(fetch_offset, tp, LenientRecords(records), *args, **kw)

    return LenientPartitionRecords


def install(consumer: Any) -> None:
    """Make ``consumer`` (a ``kafka.KafkaConsumer``) read records whose header names are not
    UTF-8 instead of stopping at them."""
    from kafka.record.default_records import DefaultRecordBatch
    from kafka.version import __version__

    fetcher: Any = getattr(consumer, "_fetcher", None)
    partition_records = getattr(type(fetcher), "PartitionRecords", None)
    if not isinstance(partition_records, type) or not hasattr(DefaultRecordBatch, "_read_msg"):
        raise ConfigurationError(
            f"kafka-python {__version__} parses records in a way outbox's reading layer does "
            "not know: install the version pyproject.toml pins"
        )
    fetcher.PartitionRecords = _classes(partition_records)
