"""``outbox trace EVENT_ID``: where one event is, from the outbox to the lake.

Cheap by design: the lake's ``events`` row carries the topic, partition and offset of the
event's first copy (so Kafka is read from there, in that one partition), its ``event_date``
partition is known from the UUIDv7 id (so each Delta read touches one day), and the Delta
version that made the row queryable is found by bisecting the table's versions (about
log2(versions) reads of that one day). Without a lake row, the aggregate's partition is
computed from its key as every Kafka producer does (murmur2); only ``--scan-kafka`` reads
every outbox topic, and either is read from an hour before the event was built (no copy is
older: :func:`~outbox_reconcile.records.earliest_copy_ms`). Each partition searched is read
to its end as it was when trace started (:mod:`outbox.core.partition_end`), or trace fails
naming it; a record met there that no reader can take at its word (a header name that is
not UTF-8) is listed with its offsets.

A caller that traces often (the console) lends a database connection and a Kafka reader it
keeps, instead of a connection and a client opened and closed each time.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

import psycopg
import pyarrow.dataset as ds
from deltalake import DeltaTable

from outbox.core.kafka_record import KafkaRecord, undecodable
from outbox.core.partition_end import Partition
from outbox.kafka_reading import KafkaReader, ReaderRole
from outbox.settings import KafkaSettings
from outbox_lake.names import typed_table_name
from outbox_lake.query import arrow_dataset, display_text
from outbox_lake.settings import LakeSettings
from outbox_lake.storage import open_table
from outbox_lake.tables import EVENTS, QUARANTINE
from outbox_reconcile.records import TOPIC_PREFIX, copy_of, earliest_copy_ms, event_time_ms
from outbox_reconcile.run import Sources
from outbox_reconcile.statements import ReconcileStatements
from outbox_relay.database import libpq_conninfo

__all__ = ["Lineage", "trace_event", "trace_reader"]

_ROLE = ReaderRole(client_id="outbox-trace", max_poll_records=5000)
_STALL_SECONDS = 30.0
"""A searched partition whose read does not move for this long: trace fails, naming it."""


@dataclass
class Lineage:
    event_id: str
    event_time: datetime
    outbox: dict[str, Any] | None = None
    dead_letter: dict[str, Any] | None = None
    kafka: list[dict[str, Any]] = field(default_factory=list)
    kafka_searched: str = "not searched"
    kafka_undecodable: list[dict[str, Any]] = field(default_factory=list)
    """Records met in the searched partitions that no reader can take at its word."""
    lake: list[dict[str, Any]] = field(default_factory=list)
    typed: dict[str, Any] | None = None
    quarantine: list[dict[str, Any]] = field(default_factory=list)
    latency: dict[str, float] = field(default_factory=dict)

    @property
    def found(self) -> bool:
        return bool(self.outbox or self.dead_letter or self.kafka or self.lake or self.quarantine)

    @property
    def trace_id(self) -> str | None:
        """The trace id of the event's ``traceparent`` (W3C), wherever one was found: the
        id to look the event's trace up by in a tracing backend."""
        places = [self.outbox or {}, *self.kafka, *self.lake]
        for place in places:
            found = _TRACE_ID.fullmatch(str(place.get("traceparent") or ""))
            if found is not None:
                return found.group(1)
        return None

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "found": self.found, "trace_id": self.trace_id}

    def lines(self) -> list[str]:
        out = [f"event {self.event_id} (built {self.event_time.isoformat()})"]
        if self.found:
            trace_id = self.trace_id
            out.append(
                f"  trace:       trace id {trace_id} (look it up in your tracing backend)"
                if trace_id
                else "  trace:       no traceparent (published outside a traced span)"
            )
        if self.outbox and self.kafka:
            out.append(
                "  outbox:      row kept until cleanup (delivered: on Kafka below; the relay "
                f"in auto mode deletes rows CDC delivered): {_fields(self.outbox)}"
            )
        elif self.outbox:
            out.append(f"  outbox:      row present, not delivered yet: {_fields(self.outbox)}")
        else:
            out.append("  outbox:      no row (delivered and deleted, or never committed)")
        if self.dead_letter:
            out.append(f"  dead letter: {_fields(self.dead_letter)}")
        if self.kafka:
            for copy in self.kafka:
                out.append(f"  kafka:       {_fields(copy)}")
        else:
            out.append(f"  kafka:       no copy found ({self.kafka_searched})")
        for record in self.kafka_undecodable:
            out.append(
                f"  kafka:       undecodable record {record['topic']}[{record['partition']}]"
                f"@{record['offset']}: {record['reason']} (it may be this event)"
            )
        for row in self.lake:
            out.append(f"  lake events: {_fields(row)}")
        if not self.lake:
            out.append("  lake events: not in the events table")
        if self.typed:
            out.append(f"  lake typed:  {_fields(self.typed)}")
        for row in self.quarantine:
            out.append(f"  quarantine:  {_fields(row)}")
        for name, seconds in self.latency.items():
            out.append(f"  latency:     {name} {seconds:.3f} s")
        return out


_TRACE_ID = re.compile(r"[0-9a-f]{2}-([0-9a-f]{32})-[0-9a-f]{16}-[0-9a-f]{2}")


def _header(record: KafkaRecord, name: str) -> str | None:
    value = next((value for key, value in record.headers if key == name), None)
    return value.decode("ascii", "replace") if value else None


def _fields(found: Mapping[str, Any]) -> str:
    """``name value, name value``: one place's facts on one line (its ``traceparent`` is
    the trace line's)."""
    return ", ".join(
        f"{name} {display_text(value)}" for name, value in found.items() if name != "traceparent"
    )


def _rows_of(table: DeltaTable, event_id: str, day: Any, columns: list[str]) -> list[Any]:
    filter_ = (ds.field("event_date") == day) & (ds.field("event_id") == event_id)
    return arrow_dataset(table).to_table(columns=columns, filter=filter_).to_pylist()  # type: ignore[no-any-return]


def _first_version(lake: LakeSettings, uri: str, latest: int, event_id: str, day: Any) -> int:
    """The first version of the table that holds the event (it is in ``latest``)."""
    low, high = 0, latest
    while low < high:
        middle = (low + high) // 2
        table = open_table(lake, uri, middle)
        if table is not None and _rows_of(table, event_id, day, ["event_id"]):
            high = middle
        else:
            low = middle + 1
    return low


def _committed_at(lake: LakeSettings, uri: str, version: int) -> datetime | None:
    table = open_table(lake, uri, version)
    history = table.history(1) if table is not None else []
    stamp = history[0].get("timestamp") if history else None
    return None if stamp is None else datetime.fromtimestamp(stamp / 1000, UTC)


def _lake(sources: Sources, lineage: Lineage) -> None:
    day = lineage.event_time.date()
    uri = sources.lake.table_uri(EVENTS)
    events = open_table(sources.lake, uri)
    columns = [
        "aggregate_type",
        "aggregate_id",
        "event_type",
        "position",
        "topic",
        "partition",
        "offset",
        "ingest_time",
        "traceparent",
    ]
    if events is not None:
        lineage.lake = _rows_of(events, lineage.event_id, day, columns)
        if lineage.lake:
            version = _first_version(sources.lake, uri, events.version(), lineage.event_id, day)
            committed = _committed_at(sources.lake, uri, version)
            for row in lineage.lake:
                row["table"] = EVENTS
                row["delta_version"] = version
                row["delta_committed_at"] = committed
    aggregate_type = next(
        (row["aggregate_type"] for row in lineage.lake),
        (lineage.outbox or lineage.dead_letter or {}).get("aggregate_type"),
    )
    if aggregate_type is not None:
        name = typed_table_name(aggregate_type)
        typed = open_table(sources.lake, sources.lake.table_uri(name))
        present = typed is not None and bool(_rows_of(typed, lineage.event_id, day, ["event_id"]))
        lineage.typed = {"table": name, "present": present}
    quarantine = open_table(sources.lake, sources.lake.table_uri(QUARANTINE))
    if quarantine is not None:
        lineage.quarantine = (
            arrow_dataset(quarantine)
            .to_table(
                columns=["target_table", "topic", "partition", "offset", "reason", "ingest_time"],
                filter=ds.field("event_id") == lineage.event_id,
            )
            .to_pylist()
        )


@contextlib.contextmanager
def _database(
    sources: Sources, lent: psycopg.Connection[Any] | None
) -> Iterator[psycopg.Connection[Any]]:
    """The connection lent (left as it is), or trace's own, read-only, closed after."""
    if lent is not None:
        yield lent
        return
    with psycopg.connect(libpq_conninfo(sources.database_url)) as connection:
        connection.read_only = True
        yield connection


def _outbox(sources: Sources, lineage: Lineage, lent: psycopg.Connection[Any] | None) -> None:
    statements = ReconcileStatements(sources.tables)
    with _database(sources, lent) as connection:
        row = connection.execute(statements.outbox_row, (lineage.event_id,)).fetchone()
        if row is not None:
            keys = (
                "aggregate_type",
                "aggregate_id",
                "event_type",
                "position",
                "created_at",
                "age_seconds",
                "traceparent",
            )
            lineage.outbox = dict(zip(keys, row, strict=True))
        dead = connection.execute(statements.dead_letter, (lineage.event_id,)).fetchone()
        if dead is not None:
            dead_keys = (
                "aggregate_type",
                "aggregate_id",
                "event_type",
                "position",
                "created_at",
                "reason",
                "failed_at",
            )
            lineage.dead_letter = dict(zip(dead_keys, dead, strict=True))


def trace_reader(kafka: KafkaSettings | str) -> KafkaReader:
    """A Kafka reader as trace opens its own, for a caller that keeps one to lend."""
    return KafkaReader(kafka, _ROLE)


def _kafka(
    sources: Sources, lineage: Lineage, *, scan_kafka: bool, lent: KafkaReader | None
) -> None:
    from kafka.partitioner.default import murmur2

    reader = lent if lent is not None else trace_reader(sources.kafka)
    try:
        starts: dict[Partition, int] = {}
        if lineage.lake:
            row = min(lineage.lake, key=lambda r: r["offset"])
            starts[(row["topic"], row["partition"])] = row["offset"]
            lineage.kafka_searched = (
                f"{row['topic']}[{row['partition']}] from offset {row['offset']}"
            )
        elif known := (lineage.outbox or lineage.dead_letter):
            topic = TOPIC_PREFIX + known["aggregate_type"]
            partitions = reader.partitions([topic])
            if partitions:
                index = (murmur2(str(known["aggregate_id"]).encode()) & 0x7FFFFFFF) % len(
                    partitions
                )
                starts[partitions[index]] = 0
                number = partitions[index][1]
                lineage.kafka_searched = f"{topic}[{number}], the aggregate's partition"
            else:
                lineage.kafka_searched = f"topic {topic} does not exist"
        elif scan_kafka:
            partitions = reader.partitions(reader.topics(sources.lake.topic_pattern))
            starts = dict.fromkeys(partitions, 0)
            lineage.kafka_searched = f"every outbox topic ({len(starts)} partitions)"
        else:
            lineage.kafka_searched = "partition unknown: use --scan-kafka to search every topic"
        if not starts:
            return
        if not lineage.lake:  # no copy is older than its event, less the clocks' margin
            since = reader.offsets_for_times(
                starts, earliest_copy_ms(event_time_ms(lineage.event_id))
            )
            ends = reader.ends(starts) if None in since.values() else {}
            starts = {p: ends[p] if at is None else at for p, at in since.items()}
            lineage.kafka_searched += ", from an hour before the event was built"
        # Retention may have deleted the start: read from the oldest record still there.
        beginnings = reader.beginnings(starts)
        starts = {p: max(offset, beginnings[p]) for p, offset in starts.items()}

        def take(records: list[KafkaRecord]) -> None:
            for record in records:
                unread = undecodable(record)
                if unread is not None:
                    lineage.kafka_undecodable.append(
                        {
                            "topic": record.topic,
                            "partition": record.partition,
                            "offset": record.offset,
                            "reason": unread.reason,
                        }
                    )
                    continue
                copy = copy_of(
                    topic=record.topic,
                    partition=record.partition,
                    offset=record.offset,
                    timestamp_ms=record.timestamp_ms,
                    key=record.key,
                    headers=record.headers,
                )
                if getattr(copy, "event_id", None) == lineage.event_id:
                    lineage.kafka.append(
                        {
                            "topic": record.topic,
                            "partition": record.partition,
                            "offset": record.offset,
                            "timestamp": datetime.fromtimestamp(record.timestamp_ms / 1000, UTC),
                            "position": getattr(copy, "position", None),
                            "traceparent": _header(record, "traceparent"),
                        }
                    )

        # To each partition's end as it was when trace started (under load, never quiet).
        reader.read_to_end(starts, take, stall_seconds=_STALL_SECONDS)
    finally:
        if lent is None:
            reader.close()
        else:  # as lent: nothing assigned (kafka-python keeps a partition paused otherwise)
            reader.assign([])


def _latency(lineage: Lineage) -> None:
    queryable = next((row.get("delta_committed_at") for row in lineage.lake), None)
    if queryable is None:
        return
    lineage.latency["built_to_queryable"] = (queryable - lineage.event_time).total_seconds()
    if lineage.outbox:
        created: datetime = lineage.outbox["created_at"]
        lineage.latency["commit_to_queryable"] = (queryable - created).total_seconds()
    if lineage.kafka:
        first: datetime = lineage.kafka[0]["timestamp"]
        lineage.latency["publish_to_queryable"] = (queryable - first).total_seconds()


def trace_event(
    sources: Sources,
    event_id: str,
    *,
    scan_kafka: bool = False,
    search_kafka: bool = True,
    database: psycopg.Connection[Any] | None = None,
    reader: KafkaReader | None = None,
) -> Lineage:
    """Where ``event_id`` is (see the module). ``search_kafka`` False: the outbox and the
    lake only, in milliseconds (Kafka's search reads every record from the event's time, or
    its lake copy's offset, to the partition's end). ``database`` and ``reader``: a
    connection and a Kafka reader the caller keeps and lends (not thread-safe: one trace at
    a time each); trace neither commits nor closes them, and leaves the reader with nothing
    assigned. Without them it opens its own, and closes them."""
    lineage = Lineage(
        event_id=event_id, event_time=datetime.fromtimestamp(event_time_ms(event_id) / 1000, UTC)
    )
    _outbox(sources, lineage, database)
    _lake(sources, lineage)
    if search_kafka:
        _kafka(sources, lineage, scan_kafka=scan_kafka, lent=reader)
    _latency(lineage)
    return lineage
