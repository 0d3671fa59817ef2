"""A PySpark Python streaming data source reading Kafka with kafka-python (``outbox_kafka``).

Spark's own Kafka source (``spark-sql-kafka``) needs a jar Maven would supply; this source
gives the same columns, so on a cluster that has the jar, ``format("kafka")`` can replace it
(see lake/outbox_lake/job.py). What it does:

- topics by regex (``pattern``), looked up again at every micro-batch: a new aggregate type
  is picked up without a restart (read from its start);
- offsets per topic-partition are the micro-batch offsets, kept in Spark's checkpoint, so a
  restarted query resumes exactly where the last committed batch ended;
- admission control: at most ``maxRecordsPerBatch`` records per micro-batch (counted as offset
  span, an upper bound of the records), shared fairly between partitions, and (``scan``) at
  most ``maxBytesPerBatch`` bytes of keys, values and headers (at least one record per
  partition, so a huge record still passes, alone);
- never past a gap: no consumer resets its offset by itself (``auto_offset_reset='none'``).
  Records deleted before they were read (retention: the earliest offset is above where the
  query stands), a partition that ends below where the query stands (the topic was deleted
  and recreated, or truncated), and a range whose records are gone when a batch is read (or
  replayed after a restart) are each *data loss*: the query stops with an error that names
  topic, partition and offsets and says what to do, unless ``failOnDataLoss`` is ``false``
  (then it goes on from the earliest offset there is, and logs how many it skipped);
- the topics' identity: the offsets also record each topic's Kafka topic id (``@topic_ids``,
  from the metadata of brokers that have them: Kafka 2.8+, Tansu), so a topic that was deleted
  and recreated, or a checkpoint that meets another cluster, is data loss too, even where the
  new topic holds as many records as the lake had read: offsets of another log would
  otherwise skip its first records silently. A checkpoint written before ids were recorded
  adopts the ids it first sees; a broker restored from a snapshot keeps its ids;
- the last record read: with ``scan``, the offsets also keep a fingerprint of the record
  before each partition's end (``@last_records``: its timestamp and a CRC-32 of its key, value
  and headers), and the scan's first read, one record back, compares it: a record of another
  log at that offset (a broker restored from a snapshot and refilled, a checkpoint from before
  ids) is data loss too. A partition read again from its start after a loss that is skipped
  says so in the batch's end offsets (``@reread``), so a replay after a restart reads the same.

Options: ``bootstrapServers``, ``pattern``, ``maxRecordsPerBatch``, ``maxBytesPerBatch``,
``failOnDataLoss``, ``endOffsets`` (``scan``, the default: find each partition's end by
reading, which works on every broker; ``broker``: trust the broker's end offsets, right for
Apache Kafka and cheaper).
"""

from __future__ import annotations

import contextlib
import logging
import re
import time
import zlib
from collections.abc import Iterator
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows

from outbox.core.errors import DataLossError, DeliveryTimeoutError
from outbox_lake.records import (
    PARSED_SCHEMA,
    RAW_COLUMNS,
    parse_one,
    parsed_record_batch,
    raw_record_batch,
)

__all__ = [
    "LAST_RECORDS",
    "REREAD",
    "TOPIC_IDS",
    "DataLossError",
    "OutboxKafkaSource",
    "positions_of",
]

log = logging.getLogger("outbox.lake.source")

_STALL_SECONDS = 60.0
_GAP_CHECK_SECONDS = 10.0
_PROBE_SECONDS = 5.0
_TAIL_SHARE = 100  # a poll bringing under 1/100 of the batch budget is the log's tail
_TAIL_SECONDS = 0.25  # how long the scan follows the tail before it leaves it to the next
_ARROW_CHUNK = 5000

Offsets = dict[str, dict[str, int]]
"""{topic: {partition (as text): next offset to read}}, and under :data:`TOPIC_IDS` the
{topic: Kafka topic id} of the topics those offsets belong to."""

TOPIC_IDS = "@topic_ids"
"""The offsets' key of the topics' ids: '@' cannot be in a Kafka topic name."""
LAST_RECORDS = "@last_records"
"""The offsets' key of {topic: {partition: fingerprint of the record before the offset}}."""
REREAD = "@reread"
"""A batch's end offsets' key of {topic: {partition: offset}}: where the batch reads a
partition from, when that is not where the last batch ended (a loss skipped: a new log)."""


def positions_of(offsets: dict[str, Any]) -> Offsets:
    """The offsets' {topic: {partition: offset}}, without what is kept beside them."""
    return {topic: parts for topic, parts in offsets.items() if not topic.startswith("@")}


def _fingerprint(record: Any) -> str:
    """What tells a record from another one at the same offset of another log."""
    crc = zlib.crc32(record.key or b"")
    crc = zlib.crc32(record.value or b"", crc)
    for name, value in record.headers:
        crc = zlib.crc32(value or b"", zlib.crc32(name.encode(), crc))
    return f"{record.timestamp}-{crc:08x}"


def _topic_id(client: Any, topic: str) -> str | None:
    """The topic's id in the consumer's latest metadata; None where the broker has none."""
    cluster = getattr(client, "_cluster", None)
    topic_id = cluster.topic_id(topic) if cluster is not None else None
    if topic_id is None or not getattr(topic_id, "int", 1):  # the all-zero id: unknown
        return None
    return str(topic_id)


def _loss_message(topic: str, partition: int | None, what: str) -> str:
    where = topic if partition is None else f"{topic}[{partition}]"
    return (
        f"{where}: {what}. The lake cannot have those records: to go on without "
        "them, restart once with OUTBOX_LAKE_FAIL_ON_DATA_LOSS=false (it reads from the "
        "earliest offset there is and logs what it skipped; events already in the lake are "
        "not duplicated); to recover them, re-publish the events from their source (see "
        "docs/operations.md, 'Data loss')"
    )


class _Range(InputPartition):
    def __init__(self, topic: str, partition: int, start: int, end: int) -> None:
        super().__init__((topic, partition, start, end))
        self.topic = topic
        self.partition = partition
        self.start = start
        self.end = end


_WORKER_CONSUMERS: dict[str, Any] = {}
"""One consumer per Python worker process, kept across micro-batches (Spark reuses workers):
connecting and fetching metadata for every partition of every batch cost most of a batch."""


def _worker_consumer(bootstrap_servers: str) -> Any:
    consumer = _WORKER_CONSUMERS.get(bootstrap_servers)
    if consumer is None:
        consumer = _consumer(bootstrap_servers)
        _WORKER_CONSUMERS[bootstrap_servers] = consumer
    return consumer


def _consumer(bootstrap_servers: str) -> Any:
    from kafka import KafkaConsumer

    return KafkaConsumer(
        bootstrap_servers=bootstrap_servers.split(","),
        isolation_level="read_committed",
        group_id=None,
        enable_auto_commit=False,
        # Never jump: an offset that is out of range raises, and is reported as data loss.
        auto_offset_reset="none",
        client_id="outbox-lake",
        # kafka-python's per-topic metrics map '.' to '_': topics 'a.b' and 'a_b' collide
        # in its registry and the fetcher raises. We keep metrics of our own.
        metrics_enabled=False,
    )


def _record_before(records: Any, end: int) -> Any:
    """The record at offset ``end - 1`` among ``records`` (in offset order), or None."""
    for record in reversed(records):
        if record.offset < end:
            return record if record.offset == end - 1 else None
    return None


def _record_bytes(record: Any) -> int:
    size = len(record.key or b"") + len(record.value or b"")
    return size + sum(len(name) + len(value or b"") for name, value in record.headers)


class OutboxKafkaSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "outbox_kafka"

    def schema(self) -> str:
        return PARSED_SCHEMA if self._parse() else RAW_COLUMNS

    def _parse(self) -> bool:
        options = {str(key).lower(): value for key, value in dict(self.options).items()}
        return str(options.get("parse", "false")).lower() == "true"

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        options = {str(key).lower(): value for key, value in dict(self.options).items()}
        missing = [name for name in ("bootstrapservers", "pattern") if not options.get(name)]
        if missing:
            raise ValueError(f"outbox_kafka needs the option(s) {missing}")
        return _KafkaStreamReader(
            bootstrap_servers=options["bootstrapservers"],
            pattern=options["pattern"],
            max_records=int(options.get("maxrecordsperbatch", "50000")),
            max_bytes=int(options.get("maxbytesperbatch", str(64 * 2**20))),
            fail_on_data_loss=options.get("failondataloss", "true").lower() != "false",
            end_offsets=options.get("endoffsets", "scan"),
            parse=self._parse(),
        )


class _KafkaStreamReader(DataSourceStreamReader):
    def __init__(
        self,
        *,
        bootstrap_servers: str,
        pattern: str,
        max_records: int,
        fail_on_data_loss: bool,
        end_offsets: str = "scan",
        max_bytes: int = 64 * 2**20,
        parse: bool = False,
    ) -> None:
        self.bootstrap_servers = bootstrap_servers
        self.pattern = re.compile(pattern)
        self.max_records = max_records
        self.max_bytes = max_bytes
        self.probe_seconds = _PROBE_SECONDS
        self.tail_seconds = _TAIL_SECONDS
        self.parse = parse
        self.fail_on_data_loss = fail_on_data_loss
        if end_offsets not in {"scan", "broker"}:
            raise ValueError(f"endOffsets={end_offsets!r}: use 'scan' or 'broker'")
        self.end_offsets = end_offsets
        self._client: Any = None
        self._ids_now: dict[str, str] | None = None  # {topic: id} as of the last _bounds
        self._firsts_now: dict[Any, int] = {}  # earliest offsets, as of the last _bounds
        self._rereads: dict[Any, int] = {}  # partitions this plan reads again from an offset
        self._no_id_told: set[str] = set()

    # -- offsets (on the driver) -------------------------------------------------------------

    def _kafka(self) -> Any:
        if self._client is None:
            self._client = _consumer(self.bootstrap_servers)
        return self._client

    def _bounds(self) -> tuple[dict[Any, int], dict[Any, int]]:
        from kafka import TopicPartition

        client = self._kafka()
        topics = [topic for topic in client.topics() if self.pattern.search(topic)]
        ids = {topic: _topic_id(client, topic) for topic in topics}
        self._ids_now = {topic: topic_id for topic, topic_id in ids.items() if topic_id}
        partitions = [
            TopicPartition(topic, number)
            for topic in sorted(topics)
            for number in sorted(client.partitions_for_topic(topic) or ())
        ]
        if not partitions:
            return {}, {}
        return client.beginning_offsets(partitions), client.end_offsets(partitions)

    def initialOffset(self) -> dict[str, Any]:
        return {}  # every partition from its start (a new topic too)

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.max_records)

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        beginnings, ends = self._bounds()
        self._firsts_now = beginnings
        self._rereads = {}
        current: Offsets = {topic: dict(parts) for topic, parts in positions_of(start).items()}
        lasts = {topic: dict(parts) for topic, parts in (start.get(LAST_RECORDS) or {}).items()}
        ids = self._same_topics(dict(start.get(TOPIC_IDS) or {}), current)
        for topic in {tp.topic for tp in self._rereads}:
            lasts.pop(topic, None)  # another log: its last records are not the lake's
        positions: dict[Any, int] = {}
        for tp in ends:
            at = current.get(tp.topic, {}).get(str(tp.partition), 0)
            first = beginnings.get(tp, 0)
            if at < first:
                at = self._lost(
                    tp,
                    f"offsets {at} to {first - 1} were deleted by retention before the lake "
                    "read them",
                    resume_at=first,
                    skipped=first - at,
                )
            elif self.end_offsets == "broker" and ends[tp] < at:
                at = self._lost(
                    tp,
                    f"the partition ends at offset {ends[tp]}, below offset {at} where the "
                    "lake stands: the topic was deleted and recreated, or truncated",
                    resume_at=first,
                    skipped=None,
                )
            positions[tp] = at
            current.setdefault(tp.topic, {})[str(tp.partition)] = at
        budget = None if isinstance(limit, ReadAllAvailable) else limit.max_rows  # type: ignore[attr-defined]
        read: dict[Any, list[Any]] = {}
        if self.end_offsets == "broker":
            found = {tp: end for tp, end in ends.items() if end > positions[tp]}
        else:
            found = self._scan(positions, beginnings, budget, lasts, read)
            for tp, at in positions.items():  # a probe may have moved one (data loss skipped)
                current[tp.topic][str(tp.partition)] = at
        share = None if budget is None else max(1, budget // max(1, len(found)))
        for tp, end in found.items():
            if share is not None:
                end = min(end, positions[tp] + share)
            current[tp.topic][str(tp.partition)] = end
            last = _record_before(read.get(tp, ()), end)
            if last is not None:
                lasts.setdefault(tp.topic, {})[str(tp.partition)] = _fingerprint(last)
            else:
                lasts.get(tp.topic, {}).pop(str(tp.partition), None)
        for tp in self._rereads:
            if tp not in found:  # read again from an offset, and nothing there yet
                lasts.get(tp.topic, {}).pop(str(tp.partition), None)
        offsets: dict[str, Any] = dict(current)
        if ids:
            offsets[TOPIC_IDS] = ids
        if any(lasts.values()):
            offsets[LAST_RECORDS] = {topic: parts for topic, parts in lasts.items() if parts}
        if self._rereads:
            rereads: Offsets = {}
            for tp, at in self._rereads.items():
                rereads.setdefault(tp.topic, {})[str(tp.partition)] = at
            offsets[REREAD] = rereads
        return offsets

    def _same_topics(self, known: dict[str, str], current: Offsets) -> dict[str, str]:
        """The topics' ids to record: those the checkpoint knows, and the broker's now.

        A topic whose id differs from the one recorded is another log than the one the
        offsets were read from: data loss (or, failOnDataLoss=false, its offsets start again
        at the new topic's earliest ones)."""
        ids = dict(known)
        now_ids = self._ids_now or {}
        for topic, now in now_ids.items():
            before = known.get(topic)
            if before is not None and before != now:
                self._lost_topic(topic, before, now)
                firsts = {tp: at for tp, at in self._firsts_now.items() if tp.topic == topic}
                self._rereads.update(firsts)  # the batch reads the new topic from its start
                current[topic] = {str(tp.partition): at for tp, at in firsts.items()}
            ids[topic] = now
        for tp in self._firsts_now:
            if tp.topic not in now_ids and tp.topic not in self._no_id_told:
                self._no_id_told.add(tp.topic)
                log.warning(
                    "%s: the broker gives this topic no id in its metadata (Kafka before 2.8?): "
                    "a topic recreated and refilled past where the lake stands cannot be told "
                    "from the one the lake read (docs/operations.md, 'Data loss')",
                    tp.topic,
                )
        return ids

    def _firsts_of(self, topic: str) -> dict[str, int]:
        """The topic's earliest offsets, as the broker last answered."""
        return {str(tp.partition): at for tp, at in self._firsts_now.items() if tp.topic == topic}

    def _lost_topic(self, topic: str, before: str, now: str) -> None:
        what = (
            f"the topic on the broker is not the one the lake has read (its topic id is {now}, "
            f"the lake's checkpoint recorded {before}): it was deleted and recreated, or the "
            "broker was replaced (a new or a restored broker) under the lake's checkpoint, so "
            "the checkpoint's offsets point into another log"
        )
        if self.fail_on_data_loss:
            raise DataLossError(_loss_message(topic, None, what))
        log.warning(
            "%s: %s; reading the new topic from its earliest offsets (failOnDataLoss=false)",
            topic,
            what,
        )

    def _lost(self, tp: Any, what: str, *, resume_at: int, skipped: int | None) -> int:
        """Stop with :class:`DataLossError`, or (failOnDataLoss=false) log and resume."""
        message = _loss_message(tp.topic, tp.partition, what)
        if self.fail_on_data_loss:
            raise DataLossError(message)
        log.warning(
            "%s: %s; skipping %s record(s) and going on from offset %d (failOnDataLoss=false)",
            f"{tp.topic}[{tp.partition}]",
            what,
            "unknown" if skipped is None else skipped,
            resume_at,
        )
        return resume_at

    def _scan(
        self,
        positions: dict[Any, int],
        beginnings: dict[Any, int],
        budget: int | None,
        lasts: dict[str, dict[str, str]] | None = None,
        read: dict[Any, list[Any]] | None = None,
    ) -> dict[Any, int]:
        """The end of each partition, found by reading from where the query stands.

        Some brokers' ListOffsets answers are not next-record offsets (Tansu answers with a
        count of record batches), so by default the end is where the records stop; at most
        ``budget`` records and about ``max_bytes`` bytes are read (admission control), each
        again later by ``read``. Reading starts one record back: that record, which the lake
        has read, must still be there; when it is not, the partition was truncated or the
        topic recreated under the query (positions in ``positions`` are updated then); when
        ``lasts`` has its fingerprint, it must be the same record. The records read go to
        ``read`` (per partition, in offset order): all of them under a ``budget``, else only
        the last (the end is then where the records stop).

        Under a budget the scan does not chase the tail for long: once the probes are
        answered and records were found, a poll that brings fewer than ``budget / 100`` new
        records (records written while the scan runs, a few at a time) ends it when the scan
        has run for ``_TAIL_SECONDS``; the next trigger takes the rest. Chasing them poll
        after poll until one came back empty delayed the whole batch (up to a second at 500
        events/s on the durable broker); ending at the first small poll made batches too small
        at 5,000 events/s and more.
        """
        if not positions:
            return {}
        client = self._kafka()
        client.assign(list(positions))
        probes: dict[Any, int] = {}
        for tp, at in positions.items():
            if at > beginnings.get(tp, 0):
                probes[tp] = at - 1
            client.seek(tp, probes.get(tp, at))
        found: dict[Any, int] = {}
        seen = 0
        size = 0
        full: set[Any] = set()
        patient_until = time.monotonic() + self.probe_seconds
        tail = None if budget is None else max(1, budget // _TAIL_SHARE)
        started = time.monotonic()
        while (budget is None or seen < budget) and len(full) < len(positions):
            batches = client.poll(timeout_ms=150, max_records=5000)
            seen_before = seen
            if not batches and probes and time.monotonic() < patient_until:
                continue  # a probe's record is there on every healthy partition: wait for it
            if not batches and probes:  # probes that read nothing at all: look closer
                for tp, probe in list(probes.items()):
                    del probes[tp]
                    self._probe_again(client, tp, probe, positions)
                continue
            if not batches:
                break
            for tp, records in batches.items():
                if tp in probes:
                    probe = probes.pop(tp)
                    if records[0].offset > probe:
                        self._probe_again(client, tp, probe, positions)
                        continue
                    known = (lasts or {}).get(tp.topic, {}).get(str(tp.partition))
                    first = records[0]
                    if known and first.offset == probe and _fingerprint(first) != known:
                        self._another_record(client, tp, probe, positions)
                        continue
                kept = None if read is None else read.setdefault(tp, [])
                for record in records:
                    if record.offset < positions[tp] or tp in full:
                        continue
                    if size >= self.max_bytes and tp in found:
                        full.add(tp)  # this partition's budget is spent: end before it
                        continue
                    size += _record_bytes(record)
                    seen += 1
                    found[tp] = record.offset + 1
                    if kept is not None:
                        if budget is None:
                            kept[:] = [record]
                        else:
                            kept.append(record)
            small = tail is not None and seen - seen_before < tail
            if small and found and not probes and time.monotonic() - started >= self.tail_seconds:
                break  # the log's tail, written while we read: the next trigger's
        return found

    def _another_record(self, client: Any, tp: Any, probe: int, positions: dict[Any, int]) -> None:
        """The record at ``probe`` is not the one the lake read there: another log."""
        first = client.beginning_offsets([tp]).get(tp, 0)
        positions[tp] = self._lost(
            tp,
            f"the record at offset {probe} is not the one the lake read there (another "
            "timestamp or content): the partition is another log than the one the lake's "
            "checkpoint read (a broker restored from a snapshot, or the topic recreated) and "
            "the checkpoint's offsets point into it",
            resume_at=first,
            skipped=None,
        )
        self._rereads[tp] = positions[tp]
        client.seek(tp, positions[tp])

    def _probe_again(self, client: Any, tp: Any, probe: int, positions: dict[Any, int]) -> None:
        """Read the record at ``probe`` alone, patiently, with a consumer of its own: gone
        means the partition shrank under the query.

        Either way the scan then goes on from where the query stands (or, after a loss that
        is skipped, from the partition's earliest offset)."""
        if not self._record_exists(tp, probe):
            first = client.beginning_offsets([tp]).get(tp, 0)
            if first <= probe:  # not retention: the record the lake read is not there
                self._rereads[tp] = positions[tp] = self._lost(
                    tp,
                    f"offset {probe}, which the lake read, is gone though the partition starts "
                    f"at {first}: the topic was deleted and recreated, or truncated",
                    resume_at=first,
                    skipped=None,
                )
        client.seek(tp, positions[tp])

    def _record_exists(self, tp: Any, offset: int) -> bool:
        return _has_record(self.bootstrap_servers, tp, offset)

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[InputPartition]:
        end_ids = end.get(TOPIC_IDS) or {}
        if self._ids_now is None and end_ids:
            # A batch replayed after a restart: are its topics still the ones it planned?
            self._firsts_now = self._bounds()[0]
        rereads: Offsets = end.get(REREAD) or {}
        ranges: list[InputPartition] = []
        for topic, parts in positions_of(end).items():
            planned, now = end_ids.get(topic), (self._ids_now or {}).get(topic)
            if planned is not None and now is not None and planned != now:
                # Recreated since the batch was planned (a replay after a restart); asked to
                # go on: read the new topic from its start (the sink dedups).
                self._lost_topic(topic, str(planned), now)
                start = {**start, topic: self._firsts_of(topic)}
            for number, stop in parts.items():
                begin = start.get(topic, {}).get(number, 0)
                begin = rereads.get(topic, {}).get(number, begin)  # a loss skipped: a new log
                if stop < begin:
                    # Only after data loss that was skipped (failOnDataLoss=false): the topic
                    # was recreated or truncated below the query; read it from its start.
                    begin = 0
                if stop > begin:
                    ranges.append(_Range(topic, int(number), begin, stop))
        return ranges

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to do: the offsets live in Spark's checkpoint, not in Kafka."""

    def stop(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    # -- records (on the executors) ----------------------------------------------------------

    def read(self, partition: InputPartition) -> Iterator[Any]:
        """The range's records as Arrow record batches: raw Kafka columns, or (``parse``)
        already parsed into event and quarantine rows, so that Spark needs no second pass."""
        chunk: list[Any] = []
        for record in self._records(partition):
            chunk.append(record)
            if len(chunk) >= _ARROW_CHUNK:
                yield self._batch(chunk)
                chunk = []
        if chunk:
            yield self._batch(chunk)

    def _batch(self, records: list[Any]) -> Any:
        if self.parse:
            return parsed_record_batch(
                [
                    parse_one(r.topic, r.partition, r.offset, r.key, r.value, r.headers)
                    for r in records
                ]
            )
        return raw_record_batch(records)

    def _records(self, partition: InputPartition) -> Iterator[Any]:
        from kafka import TopicPartition
        from kafka.errors import OffsetOutOfRangeError

        assert isinstance(partition, _Range)
        consumer = _worker_consumer(self.bootstrap_servers)
        tp = TopicPartition(partition.topic, partition.partition)
        expected = partition.start
        try:
            consumer.assign([tp])
            consumer.seek(tp, expected)
            stalled_since = time.monotonic()
            checked_at = stalled_since
            while expected < partition.end:
                try:
                    batches = consumer.poll(timeout_ms=1000, max_records=5000)
                except OffsetOutOfRangeError:
                    expected = self._gap(consumer, tp, expected, partition.end, "out of range")
                    consumer.seek(tp, expected)
                    continue
                now = time.monotonic()
                if batches:
                    stalled_since = checked_at = now
                elif now - stalled_since > _STALL_SECONDS:
                    # Never end a range early: that would skip records for good.
                    raise DeliveryTimeoutError(
                        f"{tp.topic}[{tp.partition}]: no records for {_STALL_SECONDS} s at "
                        f"offset {expected} (the batch's range ends at {partition.end}): is the "
                        "broker reachable? If it is, the topic was recreated or truncated "
                        "under the batch: see docs/operations.md, 'Data loss'"
                    )
                elif now - checked_at > _GAP_CHECK_SECONDS:
                    checked_at = now
                    expected = self._check_stall(consumer, tp, expected, partition.end)
                    consumer.seek(tp, expected)
                for record in batches.get(tp, ()):
                    if record.offset < expected:
                        continue
                    if record.offset >= partition.end:
                        return
                    if record.offset > expected:
                        expected = self._gap(consumer, tp, expected, record.offset, "missing")
                        if record.offset < expected:
                            continue
                    expected = record.offset + 1
                    yield record
        except BaseException:
            _WORKER_CONSUMERS.pop(self.bootstrap_servers, None)
            consumer.close()
            raise
        finally:
            with contextlib.suppress(Exception):
                consumer.unsubscribe()

    def _gap(self, consumer: Any, tp: Any, expected: int, upto: int, how: str) -> int:
        """Records from ``expected`` are not served (``how``): where to go on from.

        Retention (the partition now starts above ``expected``) or records gone under the
        batch are data loss. An offset the log simply does not use (a transaction marker) is
        not: the records go on above it while the partition still starts at or below it.
        """
        first = consumer.beginning_offsets([tp]).get(tp, 0)
        if first > expected:
            return self._lost(
                tp,
                f"offsets {expected} to {first - 1} were deleted by retention before the lake "
                "read them",
                resume_at=first,
                skipped=first - expected,
            )
        if how == "missing":
            return upto  # no record at those offsets, and none was deleted: markers
        return self._lost(
            tp,
            f"offset {expected} is out of range though the partition starts at {first}: the "
            "topic was deleted and recreated, or truncated",
            resume_at=upto,
            skipped=upto - expected,
        )

    def _check_stall(self, consumer: Any, tp: Any, expected: int, end: int) -> int:
        """No record at ``expected`` for a while, though the batch's range goes to ``end``.

        The range was planned from records that were there (or is replayed from the
        checkpoint): if the broker answers and still serves nothing, those records are gone.
        """
        from kafka.errors import KafkaError

        try:
            first = consumer.beginning_offsets([tp]).get(tp, 0)
            last = consumer.end_offsets([tp]).get(tp, 0)
        except KafkaError:
            return expected  # the broker does not answer: wait (and time out) as before
        if first > expected:
            return self._gap(consumer, tp, expected, end, "out of range")
        shrunk = self.end_offsets == "broker" and last <= expected
        if not shrunk and expected > first:  # the record before must still be there
            shrunk = not self._record_exists(tp, expected - 1)
        if shrunk:
            return self._lost(
                tp,
                f"the partition no longer holds the batch's range {expected} to {end - 1} "
                "(its records stop below it): the topic was deleted and recreated, or truncated",
                resume_at=end,
                skipped=end - expected,
            )
        return expected


def _has_record(bootstrap_servers: str, tp: Any, offset: int) -> bool:
    """Whether the broker serves a record at ``offset`` (asked twice, up to 10 s)."""
    consumer = _consumer(bootstrap_servers)
    try:
        consumer.assign([tp])
        for _ in range(2):
            consumer.seek(tp, offset)
            deadline = time.monotonic() + _PROBE_SECONDS
            while time.monotonic() < deadline:
                records = consumer.poll(timeout_ms=250, max_records=1).get(tp, [])
                if records:
                    if records[0].offset <= offset:
                        return True
                    break
        return False
    finally:
        consumer.close()
