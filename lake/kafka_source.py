"""A PySpark Python streaming data source reading Kafka with kafka-python (``outbox_kafka``).

Spark's own Kafka source (``spark-sql-kafka``) needs a jar Maven would supply; this source
gives the same columns, so on a cluster that has the jar, ``format("kafka")`` can replace it
(see lake/job.py). What it does:

- topics by regex (``pattern``), looked up again at every micro-batch: a new aggregate type
  is picked up without a restart (read from its start);
- offsets per topic-partition are the micro-batch offsets, kept in Spark's checkpoint, so a
  restarted query resumes exactly where the last committed batch ended;
- admission control: at most ``maxRecordsPerBatch`` records per micro-batch (counted as offset
  span, an upper bound of the records), shared fairly between partitions;
- lost data: when retention removed records before they were read (the earliest available
  offset is above where the query stands), the query stops with an error that says so,
  unless ``failOnDataLoss`` is ``false`` (then it skips ahead and logs it).

Options: ``bootstrapServers``, ``pattern``, ``maxRecordsPerBatch``, ``failOnDataLoss``,
``endOffsets`` (``scan``, the default: find each partition's end by reading, which works on
every broker; ``broker``: trust the broker's end offsets, right for Apache Kafka and cheaper).
"""

from __future__ import annotations

import contextlib
import logging
import re
import time
from collections.abc import Iterator
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows

from lake.records import RAW_COLUMNS

__all__ = ["DataLossError", "OutboxKafkaSource"]

log = logging.getLogger("outbox.lake.source")

_STALL_SECONDS = 60.0

Offsets = dict[str, dict[str, int]]
"""{topic: {partition (as text): next offset to read}}"""


class DataLossError(RuntimeError):
    """Records were removed by retention before the lake read them."""


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
        group_id=None,
        enable_auto_commit=False,
        client_id="outbox-lake",
    )


class OutboxKafkaSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "outbox_kafka"

    def schema(self) -> str:
        return RAW_COLUMNS

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        options = {str(key).lower(): value for key, value in dict(self.options).items()}
        missing = [name for name in ("bootstrapservers", "pattern") if not options.get(name)]
        if missing:
            raise ValueError(f"outbox_kafka needs the option(s) {missing}")
        return _KafkaStreamReader(
            bootstrap_servers=options["bootstrapservers"],
            pattern=options["pattern"],
            max_records=int(options.get("maxrecordsperbatch", "20000")),
            fail_on_data_loss=options.get("failondataloss", "true").lower() != "false",
            end_offsets=options.get("endoffsets", "scan"),
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
    ) -> None:
        self.bootstrap_servers = bootstrap_servers
        self.pattern = re.compile(pattern)
        self.max_records = max_records
        self.fail_on_data_loss = fail_on_data_loss
        if end_offsets not in {"scan", "broker"}:
            raise ValueError(f"endOffsets={end_offsets!r}: use 'scan' or 'broker'")
        self.end_offsets = end_offsets
        self._client: Any = None

    # -- offsets (on the driver) -------------------------------------------------------------

    def _kafka(self) -> Any:
        if self._client is None:
            self._client = _consumer(self.bootstrap_servers)
        return self._client

    def _bounds(self) -> tuple[dict[Any, int], dict[Any, int]]:
        from kafka import TopicPartition

        client = self._kafka()
        topics = [topic for topic in client.topics() if self.pattern.search(topic)]
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
        current: Offsets = {topic: dict(parts) for topic, parts in start.items()}
        positions: dict[Any, int] = {}
        for tp in ends:
            at = current.get(tp.topic, {}).get(str(tp.partition), 0)
            first = beginnings.get(tp, 0)
            if at < first:
                message = (
                    f"{tp.topic}[{tp.partition}]: offsets {at} to {first - 1} were deleted by "
                    "retention before the lake read them"
                )
                if self.fail_on_data_loss:
                    raise DataLossError(
                        message + ". Set OUTBOX_LAKE_FAIL_ON_DATA_LOSS=false to skip them."
                    )
                log.warning("%s; skipping them (failOnDataLoss=false)", message)
                at = first
            positions[tp] = at
            current.setdefault(tp.topic, {})[str(tp.partition)] = at
        budget = None if isinstance(limit, ReadAllAvailable) else limit.max_rows  # type: ignore[attr-defined]
        if self.end_offsets == "broker":
            found = {tp: end for tp, end in ends.items() if end > positions[tp]}
        else:
            found = self._scan(positions, budget)
        share = None if budget is None else max(1, budget // max(1, len(found)))
        for tp, end in found.items():
            if share is not None:
                end = min(end, positions[tp] + share)
            current[tp.topic][str(tp.partition)] = end
        return current

    def _scan(self, positions: dict[Any, int], budget: int | None) -> dict[Any, int]:
        """The end of each partition, found by reading from where the query stands.

        Some brokers' ListOffsets answers are not next-record offsets (Tansu answers with a
        count of record batches), so by default the end is where the records stop; at most
        ``budget`` records are read (admission control), each again later by ``read``.
        """
        if not positions:
            return {}
        client = self._kafka()
        client.assign(list(positions))
        for tp, at in positions.items():
            client.seek(tp, at)
        found: dict[Any, int] = {}
        seen = 0
        while budget is None or seen < budget:
            batches = client.poll(timeout_ms=150, max_records=5000)
            if not batches:
                break
            for tp, records in batches.items():
                found[tp] = records[-1].offset + 1
                seen += len(records)
        return found

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[InputPartition]:
        ranges: list[InputPartition] = []
        for topic, parts in end.items():
            for number, stop in parts.items():
                begin = start.get(topic, {}).get(number, 0)
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

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        from kafka import TopicPartition

        assert isinstance(partition, _Range)
        consumer = _worker_consumer(self.bootstrap_servers)
        tp = TopicPartition(partition.topic, partition.partition)
        try:
            consumer.assign([tp])
            consumer.seek(tp, partition.start)
            stalled_since = time.monotonic()
            while consumer.position(tp) < partition.end:
                batches = consumer.poll(timeout_ms=1000, max_records=5000)
                if batches:
                    stalled_since = time.monotonic()
                elif time.monotonic() - stalled_since > _STALL_SECONDS:
                    # Never end a range early: that would skip records for good.
                    raise TimeoutError(
                        f"{tp.topic}[{tp.partition}]: no records for {_STALL_SECONDS} s at "
                        f"offset {consumer.position(tp)} (range ends at {partition.end}); "
                        "is the broker reachable?"
                    )
                for records in batches.values():
                    for record in records:
                        if record.offset >= partition.end:
                            return
                        yield (
                            record.key,
                            record.value,
                            record.topic,
                            record.partition,
                            record.offset,
                            _timestamp(record.timestamp),
                            [(name, value) for name, value in record.headers],
                        )
        except BaseException:
            _WORKER_CONSUMERS.pop(self.bootstrap_servers, None)
            consumer.close()
            raise
        finally:
            with contextlib.suppress(Exception):
                consumer.unsubscribe()


def _timestamp(milliseconds: int) -> Any:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(milliseconds / 1000, tz=UTC)
