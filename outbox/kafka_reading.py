"""The one way this project reads Kafka: every reader (the relay's CDC watch,
``IdempotentConsumer``, reconcile, trace, the chaos suite, the demo, the tests) goes through it.

What it owns, so that no reader decides it for itself:

- **the client's settings**, built in one place (:func:`consumer_options`) from
  :class:`~outbox.settings.KafkaSettings` (where the cluster is, and how to reach it) and a
  :class:`ReaderRole` (who reads: client id, consumer group or none, fetch sizes). Always:
  committed records only (``read_committed``: Kafka Connect writes transactions, and the
  records of an aborted one must stay invisible), no automatic offset commits, and no
  kafka-python metrics (their per-topic names collide for ``a.b`` and ``a_b``);
- **records that never stop a reader**: each comes out as a
  :class:`~outbox.core.kafka_record.KafkaRecord`, whatever its bytes. One whose header name
  is not UTF-8, which kafka-python cannot parse (:mod:`outbox._lenient_records`), comes in its
  place with ``unreadable`` set; :func:`~outbox.core.kafka_record.decode_event` turns any
  record into an event or an :class:`~outbox.core.kafka_record.Undecodable` without raising;
- **where a partition ends** (:mod:`outbox.core.partition_end`): the broker's end for
  committed records, taken when the read starts, reached when the reader's position is
  there; :meth:`KafkaReader.read_to_end` reads there or raises
  :class:`~outbox.core.errors.ShortReadError`, never returns short;
- **kafka-python's errors, wrapped at the edge** (:func:`outbox.kafka_clients.kafka_errors`):
  :class:`~outbox.core.errors.BrokerUnavailable` (no answer),
  :class:`~outbox.core.errors.RecordsGoneError` (deleted under the reader),
  :class:`~outbox.core.errors.BrokerAuthenticationError` (who we are was refused: TLS, SASL),
  :class:`~outbox.core.errors.BrokerAuthorizationError` (outside our ACLs),
  :class:`~outbox.core.errors.BrokerError` (anything else Kafka refused), each ``from`` the
  original.

Needs ``kafka-python`` (``pip install 'outbox-relay[relay]'``), imported on first use.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, fields, replace
from typing import Any, Literal

from outbox.core.errors import ConfigurationError, RecordsGoneError
from outbox.core.kafka_record import KafkaRecord
from outbox.core.partition_end import Partition, PartitionRange, ReadToEnd
from outbox.kafka_clients import kafka_errors, open_client
from outbox.kafka_options import client_options
from outbox.settings import KafkaSettings, kafka_settings

__all__ = [
    "KafkaReader",
    "Partition",
    "PartitionRange",
    "ReaderRole",
    "consumer_options",
]

_POLL_SECONDS = 0.2


@dataclass(frozen=True)
class ReaderRole:
    """Who reads, and how much at a time: everything about a reader its settings do not say.

    ``group_id``: a consumer group (Kafka assigns the partitions and keeps the committed
    offsets); ``None``: the reader assigns partitions and seeks itself, and commits nothing.
    ``when_offsets_gone``: what a reader does when the records at its position were deleted
    (retention, a recreated topic): ``earliest`` goes on from the oldest record still there
    (a consumer group's first start, too); ``fail`` raises
    :class:`~outbox.core.errors.RecordsGoneError`. Default: ``earliest`` for a group,
    ``fail`` for a reader that seeks itself (it reads a range it was given: skipping part of
    it would be a short read).
    """

    client_id: str
    group_id: str | None = None
    when_offsets_gone: Literal["earliest", "fail"] | None = None
    max_poll_records: int = 500
    fetch_max_wait_ms: int = 500
    fetch_max_bytes: int = 50 * 2**20
    max_partition_fetch_bytes: int = 2**20
    session_timeout_ms: int | None = None
    heartbeat_interval_ms: int | None = None
    max_poll_interval_ms: int | None = None

    def with_options(self, options: Mapping[str, Any] | None) -> ReaderRole:
        """This role with some of its fields changed by name (``IdempotentConsumer``'s
        ``consumer_options``); any other name is a :class:`ConfigurationError`."""
        if not options:
            return self
        known = {field.name for field in fields(self)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise ConfigurationError(
                f"consumer option(s) {', '.join(unknown)} unknown: a reader's options are "
                f"{', '.join(sorted(known))}; how to reach the cluster is KafkaSettings' "
                "(OUTBOX_KAFKA_*)"
            )
        return replace(self, **options)


def consumer_options(settings: KafkaSettings, role: ReaderRole) -> dict[str, Any]:
    """kafka-python's ``KafkaConsumer`` options for ``role`` on the cluster of ``settings``
    (its servers and security: :func:`outbox.kafka_clients.client_options`): the one place
    they are built."""
    gone = role.when_offsets_gone or ("earliest" if role.group_id is not None else "fail")
    options: dict[str, Any] = {
        **client_options(settings, client_id=role.client_id),
        "group_id": role.group_id,
        "isolation_level": "read_committed",
        "enable_auto_commit": False,
        "auto_offset_reset": "earliest" if gone == "earliest" else "none",
        "metrics_enabled": False,  # its per-topic names collide for a.b and a_b
        "max_poll_records": role.max_poll_records,
        "fetch_max_wait_ms": role.fetch_max_wait_ms,
        "fetch_max_bytes": role.fetch_max_bytes,
        "max_partition_fetch_bytes": role.max_partition_fetch_bytes,
    }
    group_timing = {
        "session_timeout_ms": role.session_timeout_ms,
        "heartbeat_interval_ms": role.heartbeat_interval_ms,
        "max_poll_interval_ms": role.max_poll_interval_ms,
    }
    options.update({name: value for name, value in group_timing.items() if value is not None})
    return options


def _record(consumed: Any) -> KafkaRecord:
    return KafkaRecord(
        consumed.topic,
        consumed.partition,
        consumed.offset,
        consumed.timestamp,
        consumed.key,
        consumed.value,
        consumed.headers,
        getattr(consumed.headers, "problem", None),
    )


class KafkaReader:
    """One Kafka consumer of ours (see the module). Not thread-safe, as kafka-python's."""

    def __init__(self, settings: KafkaSettings | str, role: ReaderRole) -> None:
        from kafka import KafkaConsumer

        from outbox import _lenient_records

        self.settings = kafka_settings(settings)
        options = consumer_options(self.settings, role)
        self.servers = ",".join(options["bootstrap_servers"])
        self.role = role
        self._consumer: Any = open_client(self.settings, KafkaConsumer, options)
        try:
            _lenient_records.install(self._consumer)
        except BaseException:
            self._consumer.close(autocommit=False)
            raise

    # -- what there is ----------------------------------------------------------------------

    def topics(self, pattern: str | re.Pattern[str]) -> list[str]:
        """The topics whose name ``pattern`` finds (``re.search``), sorted."""
        found = re.compile(pattern) if isinstance(pattern, str) else pattern
        with kafka_errors(self.settings):
            names = self._consumer.topics()
        return sorted(name for name in names if found.search(name))

    def partitions(self, topics: Iterable[str]) -> list[Partition]:
        """Every partition of ``topics`` (none for a topic that does not exist), in order."""
        from kafka import TopicPartition

        found: list[Partition] = []
        with kafka_errors(self.settings):
            for topic in topics:
                numbers = self._consumer.partitions_for_topic(topic) or ()
                found += [TopicPartition(topic, number) for number in sorted(numbers)]
        return found

    def topic_ids(self, topics: Iterable[str]) -> dict[str, str | None]:
        """Each topic's Kafka id from fresh metadata (``None``: the broker gives none, or
        the topic does not exist): a topic deleted and made again has a new one."""
        with kafka_errors(self.settings):
            self._consumer.topics()  # fresh metadata
        cluster = getattr(self._consumer, "_cluster", None)
        found: dict[str, str | None] = {}
        for topic in topics:
            topic_id = cluster.topic_id(topic) if cluster is not None else None
            # kafka-python's all-zero id stands for "unknown"
            found[topic] = str(topic_id) if topic_id is not None and topic_id.int else None
        return found

    def beginnings(self, partitions: Iterable[Partition]) -> dict[Partition, int]:
        with kafka_errors(self.settings):
            return dict(self._consumer.beginning_offsets(_tps(partitions)))

    def ends(self, partitions: Iterable[Partition]) -> dict[Partition, int]:
        """Each partition's end for committed records (the last stable offset), now."""
        with kafka_errors(self.settings):
            return dict(self._consumer.end_offsets(_tps(partitions)))

    def offsets_for_times(
        self, partitions: Iterable[Partition], timestamp_ms: int
    ) -> dict[Partition, int | None]:
        """The first offset of a record at or after ``timestamp_ms``; ``None``: none yet."""
        with kafka_errors(self.settings):
            found = self._consumer.offsets_for_times(dict.fromkeys(_tps(partitions), timestamp_ms))
        return {tp: None if at is None else at.offset for tp, at in found.items()}

    # -- where to read ----------------------------------------------------------------------

    def assign(self, partitions: Iterable[Partition]) -> None:
        with kafka_errors(self.settings):
            self._consumer.assign(_tps(partitions))

    def subscribe(self, topics: Iterable[str] = (), pattern: str | None = None) -> None:
        with kafka_errors(self.settings):
            if pattern is not None:
                self._consumer.subscribe(pattern=pattern)
            else:
                self._consumer.subscribe(list(topics))

    def seek(self, partition: Partition, offset: int) -> None:
        with kafka_errors(self.settings):
            self._consumer.seek(_tps([partition])[0], offset)

    def seek_to_beginning(self, partitions: Iterable[Partition]) -> None:
        with kafka_errors(self.settings):
            self._consumer.seek_to_beginning(*_tps(partitions))

    def position(self, partition: Partition) -> int:
        """The offset of the next record the reader would fetch (past markers and aborted
        records it has fetched)."""
        with kafka_errors(self.settings):
            return int(self._consumer.position(_tps([partition])[0]))

    def pause(self, partitions: Iterable[Partition]) -> None:
        with kafka_errors(self.settings):
            self._consumer.pause(*_tps(partitions))

    # -- reading ----------------------------------------------------------------------------

    def poll(self, timeout_seconds: float, max_records: int | None = None) -> list[KafkaRecord]:
        """The records fetched so far (waiting up to ``timeout_seconds`` for some), in offset
        order per partition; every record, readable or not (see the module)."""
        with kafka_errors(self.settings):
            batches = self._consumer.poll(
                timeout_ms=int(timeout_seconds * 1000), max_records=max_records
            )
            if not batches:
                self._raise_if_refused()
        return [_record(consumed) for records in batches.values() for consumed in records]

    def _raise_if_refused(self) -> None:
        """kafka-python (3.0) notes an assigned topic the broker refuses to describe (outside
        our ACLs) in its metadata and then waits for it for ever: say so instead."""
        from kafka.errors import TopicAuthorizationFailedError

        cluster = getattr(self._consumer, "_cluster", None)
        refused = set(getattr(cluster, "unauthorized_topics", ()) or ())
        mine = {tp.topic for tp in self._consumer.assignment()}
        if refused & mine:
            raise TopicAuthorizationFailedError(refused & mine)

    def read_to_end(
        self,
        starts: Mapping[Partition, int],
        take: Callable[[list[KafkaRecord]], None],
        *,
        stall_seconds: float,
        ends: Mapping[Partition, int] | None = None,
        max_records: int = 5000,
    ) -> dict[Partition, PartitionRange]:
        """Read each partition of ``starts`` from its start to its end (``ends``, or the
        broker's ends now), handing the records to ``take`` one poll at a time.

        Returns each partition's range, read in full. Raises
        :class:`~outbox.core.errors.ShortReadError` (topic, partition, offsets) when a
        partition's position does not move for ``stall_seconds`` before its end, or when its
        records are gone under the reader: never returns short.
        """
        partitions = list(starts)
        self.assign(partitions)
        if ends is None:
            ends = self.ends(partitions)
        progress = ReadToEnd(starts, ends, stall_seconds=stall_seconds, now=time.monotonic())
        for partition in partitions:
            self.seek(partition, starts[partition])
        self.pause([p for p in partitions if progress.is_done(p)])
        while not progress.finished:
            try:
                records = self.poll(_POLL_SECONDS, max_records=max_records)
            except RecordsGoneError as gone:
                where = (gone.topic, gone.partition)
                raise progress.range(where).short_read(str(gone)) from gone
            kept = [r for r in records if progress.keeps((r.topic, r.partition), r.offset)]
            if kept:
                take(kept)
            now = time.monotonic()
            for partition in progress.remaining:
                progress.observe(partition, self.position(partition), now)
                if progress.is_done(partition):
                    self.pause([partition])
            stalled = progress.stalled(now)
            if stalled:
                raise progress.range(stalled[0]).short_read(
                    f"its position did not move for {stall_seconds:.0f} s "
                    f"({len(stalled)} partition(s) stalled): Kafka stopped answering for it; "
                    "run again once it answers"
                )
        return {partition: progress.range(partition) for partition in partitions}

    # -- the end ----------------------------------------------------------------------------

    def commit(self) -> None:
        """Commit the group's positions (a group reader only)."""
        with kafka_errors(self.settings):
            self._consumer.commit()

    def close(self) -> None:
        """Leave (nothing committed); a broker already gone is not an error here."""
        from kafka.errors import KafkaError

        try:
            self._consumer.close(autocommit=False)
        except KafkaError:
            return


def _tps(partitions: Iterable[Partition]) -> list[Any]:
    from kafka import TopicPartition

    return [p if isinstance(p, TopicPartition) else TopicPartition(*p) for p in partitions]
