"""After the load: drain, then check the lake and Kafka against the writers' ground truth.

Draining waits (each step with the run's deadline) until the outbox is empty, the lake holds
every committed event, and the lake holds every event Kafka holds (unknown-outcome commits
that did commit included). The checks read Kafka and the lake themselves, independently of
``outbox reconcile`` (which runs too, and must find nothing):

- **lost**: committed, or of unknown outcome but seen on Kafka (so committed), and not in
  the lake's ``events``;
- **duplicated**: an event id more than once in ``events``;
- **phantom**: an event of a rolled-back or aborted transaction on Kafka or in the lake;
  **never written**: an id on Kafka or in the lake that no writer built;
- **order**: per aggregate, the first copies in the lake (by partition and offset), and on
  Kafka, must have rising positions; each lake row's position must be the one its
  transaction read back; and the ground truth itself must agree (the shared accounts'
  versions, raised under the row lock, rise with the position);
- **unknown outcome**: counted apart, landed or not (at most once: the duplicate check).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import subprocess
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError

from chaos.truth import GroundTruth, Written
from outbox.core.errors import BrokerError
from outbox.core.kafka_record import KafkaRecord, Undecodable, undecodable
from outbox.kafka_reading import KafkaReader, ReaderRole
from outbox_lake.settings import LakeSettings
from outbox_reconcile.records import KafkaCopy, copy_of

__all__ = [
    "Checks",
    "Drain",
    "KafkaCopies",
    "ReconcileRun",
    "check",
    "drain",
    "kafka_copies",
    "lake_rows",
    "run_reconcile",
]

_EXAMPLES = 5
_ROLE = ReaderRole(client_id="outbox-chaos", max_poll_records=5000)
_LAKE_COLUMNS = ["event_id", "aggregate_type", "aggregate_id", "position", "partition", "offset"]


@dataclass(frozen=True)
class LakeRow:
    event_id: str
    aggregate_type: str
    aggregate_id: str
    position: int | None
    partition: int
    offset: int


def lake_rows(settings: LakeSettings) -> list[LakeRow]:
    """Every row of ``events`` (read with deltalake, never with Spark)."""
    try:
        table = DeltaTable(settings.table_uri("events"))
    except TableNotFoundError:
        return []
    return [LakeRow(**row) for row in table.to_pyarrow_table(columns=_LAKE_COLUMNS).to_pylist()]


def _lake_ids(settings: LakeSettings) -> set[str]:
    try:
        table = DeltaTable(settings.table_uri("events"))
    except TableNotFoundError:
        return set()
    return set(table.to_pyarrow_table(columns=["event_id"]).column(0).to_pylist())


@dataclass
class KafkaCopies:
    copies: list[KafkaCopy] = field(default_factory=list)
    undecodable: list[Undecodable] = field(default_factory=list)
    """Records no reader can take at its word: none of our writers makes one."""


def kafka_copies(
    bootstrap_servers: str, topic_pattern: str, stall_seconds: float = 60.0
) -> KafkaCopies:
    """Every record of the matching topics, from their beginning to their end as the broker
    gives it now (:mod:`outbox.core.partition_end`); ``ShortReadError`` when a partition
    cannot be read that far."""
    reader = KafkaReader(bootstrap_servers, _ROLE)
    read = KafkaCopies()

    def take(records: list[KafkaRecord]) -> None:
        for record in records:
            unread = undecodable(record)
            if unread is not None:
                read.undecodable.append(unread)
                continue
            copy = copy_of(
                topic=record.topic,
                partition=record.partition,
                offset=record.offset,
                timestamp_ms=record.timestamp_ms,
                key=record.key,
                headers=record.headers,
            )
            if isinstance(copy, KafkaCopy):
                read.copies.append(copy)

    try:
        partitions = reader.partitions(reader.topics(topic_pattern))
        if partitions:
            reader.read_to_end(reader.beginnings(partitions), take, stall_seconds=stall_seconds)
    finally:
        reader.close()
    return read


@dataclass
class Drain:
    seconds: float = 0.0
    caught_up: bool = False
    waiting_for: str = ""
    steps: dict[str, float] = field(default_factory=dict)
    """Seconds since the drain started at which each step was done."""
    kafka: KafkaCopies | None = None
    """Kafka read once the outbox was empty: every committed event is there by then."""
    kafka_error: str = ""
    """Why the last attempt to read Kafka failed (it is tried again until the deadline)."""


def drain(
    undelivered: Callable[[], int],
    truth: GroundTruth,
    lake: LakeSettings,
    bootstrap_servers: str,
    timeout: float,
) -> Drain:
    """Wait until the outbox is empty (each row leaves it only once its event is on Kafka),
    then until the lake holds every committed event and every event on Kafka, read
    meanwhile (or ``timeout`` passed)."""
    started = time.monotonic()
    deadline = started + timeout
    result = Drain()

    def waited(what: str, done: Callable[[], bool], pause: float) -> bool:
        result.waiting_for = what
        while time.monotonic() < deadline:
            with contextlib.suppress(Exception):  # a service still coming back: ask again
                if done():
                    result.steps[what] = round(time.monotonic() - started, 1)
                    return True
            time.sleep(pause)  # polling: the outbox and a folder have no event to await
        return False

    def read_kafka() -> None:
        while time.monotonic() < deadline:
            try:
                result.kafka = kafka_copies(bootstrap_servers, lake.topic_pattern)
                return
            except BrokerError as error:  # a broker still coming back: read again
                result.kafka_error = str(error)
                time.sleep(1.0)

    reader = threading.Thread(target=read_kafka, name="drain-kafka-read", daemon=True)

    def kafka_read() -> bool:
        reader.join(max(0.0, deadline - time.monotonic()))
        return result.kafka is not None

    committed = set(truth.committed)
    if waited("the outbox empty", lambda: undelivered() == 0, 1.0):
        reader.start()  # Kafka holds every committed event by now: read it meanwhile
        result.caught_up = (
            waited(
                "the lake holding every committed event",
                lambda: committed <= _lake_ids(lake),
                3.0,
            )
            and waited("Kafka read", kafka_read, 1.0)
            and waited(
                "the lake holding every event on Kafka",
                lambda: {c.event_id for c in _copies(result)} <= _lake_ids(lake),
                3.0,
            )
        )
    result.seconds = round(time.monotonic() - started, 1)
    return result


def _copies(result: Drain) -> list[KafkaCopy]:
    return [] if result.kafka is None else result.kafka.copies


@dataclass
class Checks:
    counts: dict[str, int] = field(default_factory=dict)
    """Violations by check (all must be 0)."""
    examples: dict[str, list[str]] = field(default_factory=dict)
    figures: dict[str, int] = field(default_factory=dict)

    def found(self, check: str, items: Iterable[str]) -> None:
        listed = sorted(items)
        self.counts[check] = len(listed)
        if listed:
            self.examples[check] = listed[:_EXAMPLES]

    @property
    def clean(self) -> bool:
        return not any(self.counts.values())


def _order_violations(rows: Iterable[tuple[str, str, int, int, int | None]]) -> list[str]:
    """``(aggregate type, aggregate id, partition, offset, position)`` of first copies: the
    places where, within an aggregate, a lower position follows a higher one."""
    by_aggregate: dict[tuple[str, str], list[tuple[int, int, int | None]]] = defaultdict(list)
    for aggregate_type, aggregate_id, partition, offset, position in rows:
        by_aggregate[(aggregate_type, aggregate_id)].append((partition, offset, position))
    found = []
    for (aggregate_type, aggregate_id), places in by_aggregate.items():
        places.sort()
        for before, after in itertools.pairwise(places):
            if before[2] is None or after[2] is None or after[2] <= before[2]:
                found.append(
                    f"{aggregate_type}/{aggregate_id}: position {after[2]} at offset {after[1]} "
                    f"after {before[2]} at offset {before[1]}"
                )
    return found


def _first_copies(copies: Iterable[Any]) -> list[Any]:
    first: dict[str, Any] = {}
    for copy in sorted(copies, key=lambda c: (c.partition, c.offset)):
        first.setdefault(copy.event_id, copy)
    return list(first.values())


def _versions_out_of_order(events: Iterable[Written]) -> list[str]:
    """Ground truth: per shared aggregate, versions never fall as positions rise."""
    by_aggregate: dict[tuple[str, str], list[Written]] = defaultdict(list)
    for event in events:
        if event.version is not None and event.position is not None:
            by_aggregate[(event.aggregate_type, event.aggregate_id)].append(event)
    found = []
    for (aggregate_type, aggregate_id), written in by_aggregate.items():
        written.sort(key=lambda event: event.position or 0)
        for before, after in itertools.pairwise(written):
            if (after.version or 0) < (before.version or 0):
                found.append(
                    f"{aggregate_type}/{aggregate_id}: version {after.version} at position "
                    f"{after.position} after version {before.version} at {before.position}"
                )
    return found


def check(
    truth: GroundTruth,
    rows: list[LakeRow],
    copies: list[KafkaCopy],
    undecodable: Sequence[Undecodable] = (),
) -> Checks:
    checks = Checks()
    checks.found("undecodable records on Kafka", [f"{u.place}: {u.reason}" for u in undecodable])
    in_lake = Counter(row.event_id for row in rows)
    on_kafka = {copy.event_id for copy in copies}
    committed, unknown = truth.committed, truth.unknown
    landed_unknown = {event_id for event_id in unknown if event_id in in_lake}
    checks.found(
        "lost (committed, not in the lake)",
        [i for i in committed if i not in in_lake]
        + [i for i in unknown if i in on_kafka and i not in in_lake],
    )
    checks.found(
        "duplicated in the lake",
        [f"{event_id} x{count}" for event_id, count in in_lake.items() if count > 1],
    )
    seen = on_kafka | set(in_lake)
    checks.found("phantom (rolled back or aborted, yet seen)", truth.never_committed() & seen)
    checks.found("never written, yet seen", seen - truth.known())
    lake_first = _first_copies(rows)
    checks.found(
        "order violations in the lake",
        _order_violations(
            (r.aggregate_type, r.aggregate_id, r.partition, r.offset, r.position)
            for r in lake_first
        ),
    )
    checks.found(
        "order violations on Kafka",
        _order_violations(
            (c.aggregate_type, c.aggregate_id, c.partition, c.offset, c.position)
            for c in _first_copies(copies)
        ),
    )
    expected = {**committed, **{i: unknown[i] for i in landed_unknown}}
    checks.found(
        "lake position differs from the commit's",
        [
            f"{row.event_id}: {row.position} != {expected[row.event_id].position}"
            for row in lake_first
            if row.event_id in expected and row.position != expected[row.event_id].position
        ],
    )
    checks.found(
        "ground truth: versions out of position order", _versions_out_of_order(expected.values())
    )
    checks.figures.update(
        lake_rows=len(rows),
        kafka_records=len(copies),
        kafka_duplicate_copies=len(copies) - len(on_kafka),
        unknown_landed=len(landed_unknown),
        unknown_absent=len(unknown) - len(landed_unknown),
        committed_not_on_kafka=sum(1 for i in committed if i not in on_kafka),
    )
    return checks


@dataclass
class ReconcileRun:
    exit_code: int
    report: dict[str, Any] | None
    stderr: str

    @property
    def findings(self) -> int:
        return int(self.report.get("finding_count", 0)) if self.report else 0

    @property
    def clean(self) -> bool:
        return self.exit_code == 0 and self.report is not None and self.findings == 0


def run_reconcile(
    outbox: tuple[str, ...], environment: dict[str, str], timeout: float = 900
) -> ReconcileRun:
    """``outbox reconcile --json`` as ops run it (``outbox``: the command): a process,
    settings in its environment."""
    done = subprocess.run(
        [*outbox, "reconcile", "--json", "--quiet"],
        env={**os.environ, **environment},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    try:
        report = json.loads(done.stdout) if done.stdout.strip() else None
    except json.JSONDecodeError:
        report = None
    return ReconcileRun(done.returncode, report, done.stderr.strip()[-2000:])
