"""``python -m chaos.cdc_recovery --rounds N [--kinds kill|pause|both] [--relay]``: does CDC
come back by itself after the broker and Kafka Connect are killed together, or after the
broker is paused? (issue 31)

On a stack of its own (``.stack/cdc-recovery``: PostgreSQL, the broker, Connect and the
connector, started as the broker-fault tests start them: ``tests/fix_stack.py``,
``tests/fix_cdc.py``), a writer commits events into the outbox all along. Without
``--relay`` no relay runs: only CDC delivers. Each round injects one fault:

- ``kill``: ``kill -9`` of the broker, then of Connect; a few seconds down; the broker started
  again (until it answers), then Connect (until its REST API answers): "both are back";
- ``pause``: the broker SIGSTOPped for 20-40 s, then SIGCONT ("back" at once).

``--kinds`` chooses the rounds: ``kill`` (the default), ``pause``, or ``both`` (a kill, then
a pause, and so on; ``--pauses`` is the same).

Then a fresh probe event is committed, and CDC must bring it to its topic (read
``read_committed``) within ``--bound`` seconds (120) of both being back: the round's
recovery time.

With ``--relay``, our relay runs all along in auto mode as operators run it (``outbox relay
run``, a process of its own, settings in its environment: the connector's topic prefix,
Connect's offsets topic, its default unblock idle time, a grace of 3 s as the broker-fault
tests have it). It may deliver the probe itself, so a round is judged by CDC itself: after
the probe's commit, ``pg_current_wal_lsn()``; the round recovered once the connector's slot
confirms that WAL (``confirmed_flush_lsn``) and the probe is on Kafka (either path), within
``--bound``, 180 s by default with ``--relay``: the relay aborts a hanging transaction on
Connect's offsets topic once its producer has been silent for 60 s
(``OUTBOX_RELAY_CONNECT_UNBLOCK_IDLE_SECONDS``), looking every 15 s, and Connect then
starts the task. Each round says whether the relay had to unblock Connect (its
``outbox_relay_connect_unblocked_total``; its log lines in the evidence). A relay that exits
on its own, or does not stop cleanly (exit 0 on SIGTERM) at the end, fails the run. At the
end (``--lake``, on by default with ``--relay``), the writer stopped and everything
delivered, ``outbox lake ingest --available-now`` runs once over the load's and the probes'
topics into ``<evidence>/lake``, and its ``events`` table must hold every committed event
exactly once (an event whose commit raised is unknown: there or not, never twice), in commit
order per aggregate (its ``position``).

Evidence goes to ``<dir>/evidence/<time>-seed<seed>/round-NN/`` (kept across
runs), taken in threads of its own (the round's clock runs on): a round still waiting after
``--dump-after`` seconds (30) gets Connect's thread dumps, its REST answers, the slot and the
transactions open on Connect's topics; one that misses the bound is a failure and gets
everything besides (the broker's thread dump, ``kafka-transactions.sh`` list, describe,
find-hanging and describe-producers on Connect's topics, the groups, both logs since the
round began, the relay's log). A failed round waits on, up to ``--give-up`` seconds, to
measure how long CDC takes by itself, and only then applies an operator's remedies (restart
a failed task, ``outbox connect unblock``, restart Connect) so that the next rounds can run.
Each round also reports how long each read of ``outbox-connect-offsets`` to its end took
(Connect's log), any transaction open there from before the fault, and any such transaction
still holding the ``read_committed`` readers of the outbox's topics once CDC delivers again
(also a failure).

For reproducing and for trying a fix: ``--aim`` kills only once a transaction is seen open
on the offsets topic (the window in which a kill holds the restarted worker); ``--down``
keeps both dead longer; ``--rate`` sets the writer's load; ``--connect-property`` and
``--broker-property`` (``KEY=VALUE``, repeatable) add a candidate setting to the worker's or
the broker's properties, in this process only.

With ``--debug-logs`` (the default) the broker logs its transaction and group coordinators
and Connect its herder, its topic-backed stores and its producers' transactions (the stack
has no setting for its services' logging: the log4j2 text it writes at each start is
extended, in this process only).

Exit status: 0 when every round recovered within the bound, no component exited
unplanned (nor the relay) and the lake (if checked) holds every committed event once; 1
otherwise (or when CDC did not come back even after the remedies); 2 when the stack could
not be brought up.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import itertools
import json
import os
import random
import re
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import psycopg
import sqlalchemy as sa
import typer

import outbox_migrations
from chaos.settings import ROOT
from chaos.watchdog import exit_status
from outbox import Event, Outbox, OutboxSettings
from outbox.core.contract import event_id_of, topic_for
from outbox.core.errors import OutboxError
from outbox.core.kafka_record import KafkaRecord
from outbox.kafka_clients import kafka_errors, open_client
from outbox.kafka_options import client_options
from outbox.settings import KafkaSettings
from outbox_connect import ConnectClient, ConnectError, ConnectorSettings, render_connector_config
from outbox_connect.open_transactions import open_transactions
from outbox_relay.settings import RelaySettings
from outbox_stack import PostgresCluster, StackSettings
from outbox_stack import broker as broker_module
from outbox_stack import connect as connect_module
from outbox_stack.artifacts import java_classpath, spark_extra_jars
from outbox_stack.broker import NODE_ID, KafkaBroker
from outbox_stack.connect import CONNECT_GROUP, OFFSETS_TOPIC, ConnectWorker
from outbox_stack.errors import StackError
from outbox_stack.process import ServiceProcess
from tests.fix_postgres import ROOT as TESTS_ROOT
from tests.fix_postgres import ScratchDatabase, free_port
from tests.fix_stack import KafkaServices, stack_settings, started_services
from tests.kafka_read import read_until

__all__ = [
    "Committed",
    "FaultKind",
    "Kinds",
    "LakeCheck",
    "PlannedRound",
    "RoundResult",
    "compare_lake",
    "debug_log4j2",
    "main",
    "metric_samples",
    "offsets_reads",
    "override",
    "plan_rounds",
    "properties",
    "summary_lines",
    "transactional_ids",
    "wait_for_open_offsets",
]

DEFAULT_DIR = ROOT / ".stack" / "cdc-recovery"
DATABASE = "outbox_cdc_recovery"
LOAD_TYPE = "recoveryload"
PROBE_TYPE = "recoveryprobe"
CONNECT_TOPICS = (f"{CONNECT_GROUP}-configs", OFFSETS_TOPIC, f"{CONNECT_GROUP}-status")
"""The worker's three topics (``outbox_stack.connect``), each of one partition."""
PAUSE_SECONDS = (20.0, 40.0)
DOWN_SECONDS = (1.0, 5.0)
"""How long the broker and Connect stay dead in a kill round."""
SETTLE_SECONDS = (3.0, 8.0)
"""How long CDC streams the writer's events before a round's fault."""
TIMELINE_EVERY_SECONDS = 0.5
READERS_GRACE_SECONDS = 30.0
"""How long a transaction from before the fault may stay open on an outbox topic once CDC
delivers again (the restarted task's next commit there ends it)."""
BOUND_SECONDS = 120.0
"""The default bound: CDC alone."""
UNBLOCK_IDLE_SECONDS = float(RelaySettings.model_fields["connect_unblock_idle_seconds"].default)
"""The relay's default ``connect_unblock_idle_seconds`` (60): the runs use it as is."""
RELAY_BOUND_SECONDS = 180.0
"""The default bound with ``--relay``: the relay's unblock idle time (60 s), its look every
15 s, and Connect's restart of the task, with room to spare."""
RELAY_GRACE_SECONDS = 3.0
"""The relay's grace with ``--relay``, as the broker-fault tests run it."""
RELAY_ROLE = "cdc_recovery_relay"
DRAIN_SECONDS = 300.0
"""At the end: how long the outbox has to empty and CDC to confirm the last WAL."""
LAKE_TIMEOUT_SECONDS = 1200.0
LAKE_TOPIC_PATTERN = rf"^{re.escape(topic_for(LOAD_TYPE))}$|^{re.escape(topic_for(PROBE_TYPE))}$"
"""Only the load's and the probes' topics."""
UNBLOCKED = "outbox_relay_connect_unblocked_total"
TAKEOVERS = "outbox_relay_takeovers_total"

CONNECT_DEBUG_LOGGERS = {
    "org.apache.kafka.connect.runtime.distributed": "debug",
    "org.apache.kafka.connect.storage": "debug",
    "org.apache.kafka.connect.util.KafkaBasedLog": "debug",
    "org.apache.kafka.clients.producer.internals.TransactionManager": "info",
}
"""Connect: its herder and group membership, its topic-backed stores (how far each start-up
read got), its producers' transactions (coordinator, fencing, aborts)."""
BROKER_DEBUG_LOGGERS = {
    "kafka.coordinator.transaction": "info",
    "org.apache.kafka.coordinator.transaction": "info",
    "org.apache.kafka.coordinator.group": "info",
    "kafka.coordinator.group": "info",
}
"""The broker: its transaction coordinator (loading, timing out and aborting transactions)
and its group coordinator (Connect's group: joins, rebalances, expired members)."""


class FaultKind(StrEnum):
    KILL = "kill"
    PAUSE = "pause"


class Kinds(StrEnum):
    """The rounds of a run: kills only, pauses only, or both (a kill, then a pause...)."""

    KILL = "kill"
    PAUSE = "pause"
    BOTH = "both"


@dataclass(frozen=True)
class PlannedRound:
    number: int
    kind: FaultKind
    hold_seconds: float
    """How long the broker and Connect stay dead (kill), or the broker stays paused."""
    settle_seconds: float
    """How long CDC streams before the fault."""

    def describe(self) -> str:
        held = "down" if self.kind is FaultKind.KILL else "paused"
        return f"{self.kind} ({held} {self.hold_seconds:.0f} s)"


def plan_rounds(
    rounds: int, *, kinds: Kinds, seed: int, down: float | None = None
) -> list[PlannedRound]:
    """The rounds of a run, replayed by ``seed``: kills only, pauses only, or (``both``) a
    kill, then a pause, and so on. ``down``: how long a kill round keeps both dead (default:
    1-5 s)."""
    chooser = random.Random(f"cdc-recovery:{seed}")  # noqa: S311 - replayable, no secret
    planned = []
    for number in range(1, rounds + 1):
        pause = kinds is Kinds.PAUSE or (kinds is Kinds.BOTH and number % 2 == 0)
        kind = FaultKind.PAUSE if pause else FaultKind.KILL
        hold = PAUSE_SECONDS if kind is FaultKind.PAUSE else DOWN_SECONDS
        if kind is FaultKind.KILL and down is not None:
            hold = (down, down)
        planned.append(
            PlannedRound(
                number,
                kind,
                round(chooser.uniform(*hold), 1),
                round(chooser.uniform(*SETTLE_SECONDS), 1),
            )
        )
    return planned


@dataclass
class RoundResult:
    planned: PlannedRound
    broker_ready_seconds: float | None = None
    """Kill: from the restart to the broker answering."""
    connect_ready_seconds: float | None = None
    """Kill: from the broker answering to Connect's REST API answering."""
    offsets_reads: list[float | None] = field(default_factory=list)
    """How long each read of Connect's offsets topic to its end took (its log; the first
    after a kill is the restarted worker's start-up read); None: not finished."""
    held_by: str | None = None
    """A transaction of the killed worker seen open on the offsets topic once both were
    back, if any."""
    readers_held: list[str] = field(default_factory=list)
    """Transactions from before the fault still open on the outbox's topics once CDC
    delivered again (and :data:`READERS_GRACE_SECONDS` more): every ``read_committed``
    reader (the relay's CDC watch, the lake, consumers) stops at their first record."""
    recovery_seconds: float | None = None
    """From both being back to the probe on Kafka (with the relay: to CDC confirming the
    probe's WAL, the probe on Kafka); None: it never came."""
    bound_seconds: float = BOUND_SECONDS
    evidence: Path | None = None
    notes: list[str] = field(default_factory=list)
    by_cdc: bool = False
    """Judged by CDC confirming the probe's WAL (a relay runs and may deliver the probe)."""
    probe_seconds: float | None = None
    """With the relay: from both being back to the probe on Kafka, by either path."""
    unblocked: int | None = None
    """With the relay: the hanging transactions it aborted on Connect's offsets topic during
    the round (None: its metrics did not answer)."""
    took_over: bool | None = None
    """With the relay: whether it took over from CDC during the round."""

    @property
    def ok(self) -> bool:
        return (
            self.recovery_seconds is not None
            and self.recovery_seconds <= self.bound_seconds
            and not self.readers_held
        )

    def relay_said(self) -> str:
        """Whether the relay had to unblock Connect (and took over) in the round."""
        if self.unblocked is None:
            unblocked = "unknown (no metrics)"
        else:
            unblocked = f"yes ({self.unblocked})" if self.unblocked else "no"
        took = {None: "unknown", True: "yes", False: "no"}[self.took_over]
        return f"relay unblocked Connect: {unblocked}, took over: {took}"

    def line(self) -> str:
        """One line for the round (and one per note)."""
        back = ""
        if self.broker_ready_seconds is not None:
            back = f"broker answering after {self.broker_ready_seconds:.1f} s"
        if self.connect_ready_seconds is not None:
            back += f", Connect's REST {self.connect_ready_seconds:.1f} s later"
        verdict = "ok" if self.ok else f"FAILED (bound {self.bound_seconds:.0f} s)"
        if self.by_cdc:
            judged = (
                f"probe on Kafka {_seconds(self.probe_seconds)}, CDC confirmed its WAL "
                f"{_seconds(self.recovery_seconds)} after both back; {self.relay_said()}: "
            )
        else:
            judged = f"probe on Kafka {_seconds(self.recovery_seconds)} after both back: "
        text = (
            f"round {self.planned.number} {self.planned.describe()}: "
            + (f"{back}; " if back else "")
            + judged
            + verdict
        )
        reads = ", ".join(_seconds(read) for read in self.offsets_reads)
        extra = [
            *([f"reads of {OFFSETS_TOPIC} to its end: {reads}"] if reads else []),
            *([f"open from before the fault: {self.held_by}"] if self.held_by else []),
            *(f"readers held: {held}" for held in self.readers_held),
            *self.notes,
            *([f"evidence: {self.evidence}"] if self.evidence else []),
        ]
        return text + "".join(f"\n    {note}" for note in extra)


def _seconds(value: float | None) -> str:
    return "never" if value is None else f"{value:.1f} s"


def summary_lines(
    results: Sequence[RoundResult], *, exits: Sequence[str], writer: str, planned: int = 0
) -> list[str]:
    """The run's summary: rounds, failures, recovery times (min, p50 and max, all and per
    kind), each round (kind, recovery, whether the relay unblocked Connect), how many of the
    ``planned`` rounds recovered within the bound, unplanned exits, the writer."""
    failed = [result for result in results if not result.ok]
    kinds = {kind: [r for r in results if r.planned.kind is kind] for kind in FaultKind}
    by_cdc = any(r.by_cdc for r in results)
    what = "CDC confirming the probe's WAL" if by_cdc else "probe on Kafka"
    lines = [
        f"rounds: {len(results)} ("
        + ", ".join(f"{kind} {len(done)}" for kind, done in kinds.items() if done)
        + f"); failures: {len(failed)}"
    ]
    lines += [
        f"  round {r.planned.number} ({r.planned.kind}): {what}: "
        f"{_seconds(r.recovery_seconds)} (bound {r.bound_seconds:.0f} s); evidence {r.evidence}"
        for r in failed
    ]
    groups = [("all", list(results))]
    if sum(1 for done in kinds.values() if done) > 1:
        groups += [(str(kind), done) for kind, done in kinds.items()]
    for label, chosen in groups:
        times = [r.recovery_seconds for r in chosen if r.recovery_seconds is not None]
        if not chosen:
            continue
        never = len(chosen) - len(times)
        figures = (
            f"min {min(times):.1f} s, p50 {statistics.median(times):.1f} s, max {max(times):.1f} s"
            if times
            else "none"
        )
        lines.append(
            f"recovery ({label}, {what} after both back): {figures}"
            + (f"; {never} never" if never else "")
        )
        starts = [r.offsets_reads[0] for r in chosen if r.offsets_reads]
        if starts:
            finished = [read for read in starts if read is not None]
            lines.append(
                f"  first read of {OFFSETS_TOPIC} to its end after the fault ({label}): "
                + (
                    f"p50 {statistics.median(finished):.1f} s, max {max(finished):.1f} s"
                    if finished
                    else "none finished"
                )
                + (f"; {len(starts) - len(finished)} unfinished" if None in starts else "")
            )
        readers = sum(1 for r in chosen if r.readers_held)
        if readers:
            lines.append(
                f"  rounds leaving read_committed readers of an outbox topic held: {readers}"
            )
        held = sum(1 for r in chosen if r.held_by)
        lines.append(
            f"  rounds with a transaction from before the fault open on {OFFSETS_TOPIC}: {held}"
        )
    for r in results:
        lines.append(
            f"  round {r.planned.number:2d} {r.planned.kind:5s} recovery "
            f"{_seconds(r.recovery_seconds):>7s}"
            + (f", {r.relay_said()}" if r.by_cdc else "")
            + ("" if r.ok else " FAILED")
        )
    if by_cdc:
        unblocked = [r.planned.number for r in results if r.unblocked]
        lines.append(
            f"relay unblocked Connect in {len(unblocked)} of {len(results)} rounds"
            + (f" (rounds {', '.join(map(str, unblocked))})" if unblocked else "")
        )
    bounds = sorted({f"{r.bound_seconds:.0f} s" for r in results})
    lines.append(
        f"{sum(1 for r in results if r.ok)} of {max(planned, len(results))} rounds recovered "
        f"within the bound ({', '.join(bounds) or 'none'})"
    )
    lines.append("unplanned exits: " + ("; ".join(exits) if exits else "none"))
    lines.append(f"writer: {writer}")
    return lines


def transactional_ids(listing: str) -> list[str]:
    """The transactional ids of ``kafka-transactions.sh list``'s table (its first column,
    under a ``TransactionalId`` header)."""
    lines = [line.split() for line in listing.splitlines() if line.strip()]
    header = next((n for n, words in enumerate(lines) if words[0] == "TransactionalId"), None)
    if header is None:
        return []
    return [words[0] for words in lines[header + 1 :]]


_LOG_TIME = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\] ")


def offsets_reads(lines: Iterable[str], topic: str = OFFSETS_TOPIC) -> list[float | None]:
    """From Connect's log: each read of ``topic`` to its end, in the order they began, as
    the seconds from ``Starting KafkaBasedLog with topic <topic>`` to ``Finished reading
    KafkaBasedLog for topic <topic>`` (None: not finished in ``lines``). Reads that overlap
    (the worker's and a task's) are matched first begun, first finished: the log does not
    name their threads."""
    started: list[datetime.datetime] = []
    reads: list[float | None] = []
    for line in lines:
        stamp = _LOG_TIME.match(line)
        if stamp is None:
            continue
        at = datetime.datetime.strptime(stamp.group(1), "%Y-%m-%d %H:%M:%S,%f")
        if f"Starting KafkaBasedLog with topic {topic} " in line:
            started.append(at)
            reads.append(None)
        elif f"Finished reading KafkaBasedLog for topic {topic}" in line:
            unfinished = [n for n, read in enumerate(reads) if read is None]
            if unfinished:
                first = unfinished[0]
                reads[first] = round((at - started[first]).total_seconds(), 3)
    return reads


def debug_log4j2(text: str, loggers: dict[str, str]) -> str:
    """A log4j2 properties text with ``loggers`` (name -> level) set, after what it had."""
    added = "".join(
        f"logger.cdcrecovery{n}.name = {name}\nlogger.cdcrecovery{n}.level = {level}\n"
        for n, (name, level) in enumerate(loggers.items())
    )
    return (text if not text or text.endswith("\n") else text + "\n") + added


def metric_samples(text: str) -> dict[str, float]:
    """The samples of a Prometheus text page, by name (with its labels, if any)."""
    found = {}
    for line in text.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        name, _, value = line.rpartition(" ")
        with contextlib.suppress(ValueError):
            found[name.strip()] = float(value)
    return found


@dataclass(frozen=True)
class Committed:
    """An event whose commit was acknowledged, in commit order."""

    event_id: str
    aggregate_type: str
    aggregate_id: str


@dataclass(frozen=True)
class LakeCheck:
    """The lake's ``events`` table against what was committed."""

    committed: int
    once: int
    """Committed events found in the lake exactly once."""
    missing: list[str]
    doubled: list[str]
    """Event ids (committed, unknown or not) found more than once."""
    unknown: int
    """Events whose commit raised (committed or not: either is allowed, never twice)."""
    unknown_landed: int
    stray: list[str]
    """Event ids in the lake that were neither committed nor unknown."""
    order_checked: int | None
    """Aggregates whose events' positions were checked against commit order; None: not
    checked (the table has no position)."""
    out_of_order: list[str]

    @property
    def ok(self) -> bool:
        return not (self.missing or self.doubled or self.stray or self.out_of_order)

    def line(self) -> str:
        text = (
            f"lake: {self.committed} committed, {self.once} in the lake once, "
            f"{len(self.missing)} missing, {len(self.doubled)} doubled"
        )
        if self.unknown:
            text += f"; {self.unknown} unknown ({self.unknown_landed} in the lake)"
        if self.stray:
            text += f"; {len(self.stray)} never written"
        if self.order_checked is None:
            text += "; order not checked (no position)"
        else:
            text += (
                f"; order per aggregate (position): {self.order_checked} aggregates, "
                f"{len(self.out_of_order)} out of commit order"
            )
        return text

    def details(self, limit: int = 5) -> list[str]:
        """Examples of what is wrong, for the run's output."""
        return [
            f"  {what}: {', '.join(ids[:limit])}" + (" ..." if len(ids) > limit else "")
            for what, ids in (
                ("missing", self.missing),
                ("doubled", self.doubled),
                ("never written", self.stray),
                ("out of order", self.out_of_order),
            )
            if ids
        ]


def compare_lake(
    committed: Sequence[Committed], unknown: Collection[str], lake: Iterable[Mapping[str, Any]]
) -> LakeCheck:
    """The lake's ``events`` rows (``event_id``, ``aggregate_type``, ``aggregate_id``,
    ``position``) against ``committed`` (in commit order) and the ``unknown`` ids: each
    committed id once, none missing, none twice, none never written, and per aggregate the
    rows in position order are in commit order."""
    rows = list(lake)
    counts = Counter(str(row["event_id"]) for row in rows)
    order = {event.event_id: n for n, event in enumerate(committed)}
    unknown_ids = set(unknown) - set(order)
    missing = [event.event_id for event in committed if counts[event.event_id] == 0]
    doubled = sorted(event_id for event_id, count in counts.items() if count > 1)
    stray = sorted(e for e in counts if e not in order and e not in unknown_ids)
    once = sum(1 for event in committed if counts[event.event_id] == 1)
    order_checked: int | None = None
    out_of_order: list[str] = []
    if all(row.get("position") is not None for row in rows):
        aggregates: dict[tuple[str, str], list[tuple[int, int]]] = defaultdict(list)
        for row in rows:
            number = order.get(str(row["event_id"]))
            if number is not None:
                key = (str(row["aggregate_type"]), str(row["aggregate_id"]))
                aggregates[key].append((int(row["position"]), number))
        order_checked = len(aggregates)
        for (kind, aggregate), found in sorted(aggregates.items()):
            numbers = [number for _position, number in sorted(set(found))]
            if any(later <= earlier for earlier, later in itertools.pairwise(numbers)):
                out_of_order.append(f"{kind}/{aggregate}")
    return LakeCheck(
        committed=len(committed),
        once=once,
        missing=missing,
        doubled=doubled,
        unknown=len(unknown_ids),
        unknown_landed=sum(1 for event_id in unknown_ids if counts[event_id]),
        stray=stray,
        order_checked=order_checked,
        out_of_order=out_of_order,
    )


# --- the load and the probes ---------------------------------------------------------------


class LoadWriter(threading.Thread):
    """An application committing ``rate`` events a second (a transaction every 0.1 s at
    most), reconnecting after a lost connection. It keeps the events whose commit was
    acknowledged, in commit order (:attr:`events`), and those whose commit raised
    (:attr:`unknown`: committed or not)."""

    def __init__(self, conninfo: str, rate: float) -> None:
        super().__init__(name="cdc-recovery-writer", daemon=True)
        self.conninfo = conninfo
        self.batch = max(1, round(rate / 10))
        self.pause = min(0.1, self.batch / rate)
        self.committed = 0
        self.events: list[Committed] = []
        self.unknown: set[str] = set()
        self.errors: list[str] = []
        self.stopping = threading.Event()

    def run(self) -> None:
        outbox = Outbox()
        connection: psycopg.Connection | None = None
        number = 0
        while not self.stopping.is_set():
            try:
                if connection is None or connection.closed:
                    connection = psycopg.connect(self.conninfo, connect_timeout=5)
                events = [
                    Event(LOAD_TYPE, str((number + n) % 11), "Written", {"n": number + n})
                    for n in range(self.batch)
                ]
                try:
                    with connection.transaction():
                        outbox.publish_many(connection, events)
                except BaseException:
                    self.unknown.update(str(event.event_id) for event in events)
                    raise
                number += self.batch
                self.committed += self.batch
                self.events += [
                    Committed(str(event.event_id), LOAD_TYPE, event.aggregate_id)
                    for event in events
                ]
            except psycopg.OperationalError:
                connection = None
            except Exception as error:
                self.errors.append(f"{type(error).__name__}: {error}")
                return
            self.stopping.wait(self.pause)
        if connection is not None:
            connection.close()

    def describe(self) -> str:
        errors = f", stopped on {self.errors[0]}" if self.errors else ", no error"
        unknown = f" ({len(self.unknown)} more whose commit raised)" if self.unknown else ""
        return f"{self.committed} events committed{unknown}{errors}"


def probe_event(number: int) -> Event:
    return Event(PROBE_TYPE, str(number), "Probe", {"round": number})


def commit_probe(conninfo: str, event: Event) -> None:
    """Commit a probe (raises when its commit was not acknowledged)."""
    with psycopg.connect(conninfo, connect_timeout=5) as connection, connection.transaction():
        Outbox().publish(connection, event)


def current_wal(conninfo: str) -> int:
    """``pg_current_wal_lsn()``, in bytes of WAL."""
    with psycopg.connect(conninfo, connect_timeout=5) as connection:
        row = connection.execute("SELECT (pg_current_wal_lsn() - '0/0'::pg_lsn)::bigint").fetchone()
    assert row is not None
    return int(row[0])


def slot_confirmed(conninfo: str, slot: str) -> int:
    """Where ``slot`` is confirmed up to (bytes of WAL; -1 without it)."""
    with psycopg.connect(conninfo, connect_timeout=5) as connection:
        row = connection.execute(
            "SELECT (confirmed_flush_lsn - '0/0'::pg_lsn)::bigint FROM pg_replication_slots "
            "WHERE slot_name = %s",
            (slot,),
        ).fetchone()
    return -1 if row is None or row[0] is None else int(row[0])


def wait_for_slot(conninfo: str, slot: str, wal: int, *, until: float) -> bool:
    """Whether ``slot`` confirmed ``wal`` by ``until`` (monotonic): CDC itself delivered
    everything written up to there."""
    while True:
        with contextlib.suppress(psycopg.OperationalError):
            if slot_confirmed(conninfo, slot) >= wal:
                return True
        if time.monotonic() >= until:
            return False
        time.sleep(0.5)


@dataclass
class Probe:
    event_id: uuid.UUID
    wal: int | None
    """``pg_current_wal_lsn()`` just after its commit (with the relay; None without)."""
    on_kafka: float | None = None
    """When it was found on Kafka (monotonic)."""


def wait_for_probe(bootstrap: str, event_id: uuid.UUID, *, until: float) -> bool:
    """Whether the probe reached its topic (committed) by ``until`` (monotonic)."""
    wanted = str(event_id)

    def found(records: list[KafkaRecord]) -> bool:
        return any(str(event_id_of(record.headers)) == wanted for record in records)

    while time.monotonic() < until:
        try:
            records = read_until(
                bootstrap, topic_for(PROBE_TYPE), found, timeout=until - time.monotonic()
            )
        except OutboxError:
            time.sleep(1)  # the broker refused or failed a request: ask again until `until`
            continue
        return found(records)
    return False


# --- the relay and the lake ----------------------------------------------------------------


def _environment(**settings: str) -> dict[str, str]:
    """Ours without any ``OUTBOX_*`` setting (an operator's shell may export some), then
    ``settings``."""
    inherited = {k: v for k, v in os.environ.items() if not k.startswith("OUTBOX_")}
    return {**inherited, "PYTHONPATH": str(TESTS_ROOT), **settings}


class RelayRunner:
    """``outbox relay run`` in auto mode, as operators run it: a process of its own, its
    settings in its environment, its JSON log in ``log``, its ``/metrics`` on ``port``."""

    def __init__(self, env: dict[str, str], log: Path, port: int) -> None:
        self.env = env
        self.log = log
        self.port = port
        self.process: subprocess.Popen[bytes] | None = None
        self.stopped: int | None = None
        """Its exit status once stopped at the end (None: not yet)."""

    def start(self) -> None:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "outbox_cli.main", "relay", "run"],
                env=_environment(**self.env),
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def how(self) -> str:
        """How it ended (for an unplanned exit), with its last error line."""
        if self.process is None:
            return "never started"
        code = self.process.poll()
        if code is None:
            how = "running"
        elif code < 0:
            how = f"pid {self.process.pid} killed by {signal.Signals(-code).name}"
        else:
            how = f"pid {self.process.pid} exited with status {code}"
        errors = [line for line in self.tail() if '"ERROR"' in line or "Error" in line]
        return how + (f"; last error: {errors[-1][:300]}" if errors else "")

    def tail(self, lines: int = 200) -> list[str]:
        if not self.log.exists():
            return []
        return self.log.read_text(errors="replace").splitlines()[-lines:]

    def metrics(self) -> dict[str, float] | None:
        """Its ``/metrics`` samples, or None when it does not answer."""
        try:
            with urllib.request.urlopen(
                f"http://127.0.0.1:{self.port}/metrics", timeout=5
            ) as answer:
                return metric_samples(answer.read().decode())
        except (OSError, urllib.error.URLError):
            return None

    def counters(self, *names: str, tries: int = 10) -> dict[str, float] | None:
        """``names`` from its metrics (asked again for a few seconds: it may be busy)."""
        for _ in range(tries):
            samples = self.metrics()
            if samples is not None:
                return {name: samples.get(name, 0.0) for name in names}
            time.sleep(1)
        return None

    def wait_leading(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.running():
            samples = self.metrics()
            if samples is not None and samples.get("outbox_relay_leader") == 1.0:
                return True
            time.sleep(0.5)
        return False

    def log_size(self) -> int:
        return self.log.stat().st_size if self.log.exists() else 0

    def log_since(self, offset: int) -> str:
        if not self.log.exists():
            return ""
        with self.log.open("rb") as log:
            log.seek(offset)
            return log.read().decode(errors="replace")

    def stop(self, timeout: float = 60) -> int | None:
        """SIGTERM, then its exit status (it must be 0: the batch in flight finishes); killed
        if it does not stop within ``timeout`` (None then)."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            self.stopped = self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=30)
            return None
        return self.stopped

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=30)


def unblock_lines(log_text: str) -> list[str]:
    """The relay's "aborted a hanging transaction" messages in its JSON log."""
    found = []
    for line in log_text.splitlines():
        if "aborted a hanging transaction" not in line:
            continue
        try:
            message = str(json.loads(line).get("message", line))
        except (ValueError, AttributeError):
            message = line
        found.append(message[:300])
    return found


def run_lake(
    root: Path, bootstrap: str, downloads: Path, log: Path, timeout: float
) -> tuple[int | None, str]:
    """``outbox lake ingest --available-now`` over the load's and the probes' topics into
    ``root``, in a process group of its own (the job and Spark's JVM), its output in ``log``:
    its exit status (None: killed at ``timeout``) and its summary line."""
    env = _environment(
        OUTBOX_LAKE_ROOT=str(root),
        OUTBOX_LAKE_TOPIC_PATTERN=LAKE_TOPIC_PATTERN,
        OUTBOX_LAKE_TRIGGER_SECONDS="1",
        OUTBOX_KAFKA_BOOTSTRAP_SERVERS=bootstrap,
        OUTBOX_LAKE_SPARK_JARS=",".join(str(jar) for jar in spark_extra_jars(downloads)),
    )
    with log.open("wb") as out:
        job = subprocess.Popen(
            [sys.executable, "-m", "outbox_cli.main", "lake", "ingest", "--available-now"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            code: int | None = job.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            code = None
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(job.pid, signal.SIGKILL)  # Spark's JVM, if it outlived the job
            job.wait(timeout=30)
    said = [
        line
        for line in log.read_text(errors="replace").splitlines()
        if line.startswith(("lake ingest:", "lake ingest stopped:"))
    ]
    return code, (said[-1] if said else "no summary line")


def lake_events(root: Path) -> list[dict[str, Any]]:
    """The ``events`` table's rows (the columns the comparison needs)."""
    from deltalake import DeltaTable

    table = DeltaTable(str(root / "events"))
    columns = ["event_id", "aggregate_type", "aggregate_id", "position"]
    return table.to_pyarrow_table(columns=columns).to_pylist()  # type: ignore[no-any-return]


# --- what happens meanwhile ----------------------------------------------------------------


class Timeline(threading.Thread):
    """Every half second, the connector's state as REST gives it (a restarted worker shows
    the status its predecessor left in the status topic until it writes its own) and the
    slot; every two seconds, the transactions open on Connect's offsets topic. Each change,
    with the seconds since ``start``."""

    def __init__(
        self,
        client: ConnectClient,
        name: str,
        slot: Callable[[], str],
        kafka: KafkaSettings,
        start: float,
    ) -> None:
        super().__init__(name="cdc-recovery-timeline", daemon=True)
        self.client = client
        self.name = name
        self.slot = slot
        self.kafka = kafka
        self.start_at = start
        self.entries: list[tuple[float, str]] = []
        self.held_by: str | None = None
        """The first orphan transaction (its producer silent since before both were back)
        seen open on the offsets topic, described."""
        self.stopping = threading.Event()

    def run(self) -> None:
        last_state = last_slot = last_open = None
        next_open = 0.0
        while not self.stopping.is_set():
            now = time.monotonic() - self.start_at
            state = self._state()
            if state != last_state:
                self.entries.append((now, f"connector: {state}"))
                last_state = state
            slot = self.slot()
            if slot != last_slot:
                self.entries.append((now, f"slot: {slot}"))
                last_slot = slot
            if now >= next_open:
                next_open = now + 2.0
                held = self._open()
                if held is not None and held[0] != last_open:
                    self.entries.append((now, f"{OFFSETS_TOPIC}: {held[1]}"))
                    last_open = held[0]
                    if self.held_by is None and held[2]:
                        self.held_by = held[1]
            self.stopping.wait(TIMELINE_EVERY_SECONDS)

    def _state(self) -> str:
        try:
            state = self.client.state(self.name)
        except ConnectError as error:
            return f"REST: {str(error)[:120]}"
        if state is None:
            return "absent (404)"
        tasks = ", ".join(
            f"{task}:{task_state}" + (f" {(trace or '').splitlines()[:1]}" if trace else "")
            for task, task_state, trace in state.tasks
        )
        return f"{state.connector} [{tasks}]"

    def _open(self) -> tuple[str, str, bool] | None:
        """(what identifies the open transactions, their description, whether one of them
        is an orphan: its producer silent since before both were back), or None when the
        broker did not answer."""
        try:
            held = open_transactions(self.kafka, OFFSETS_TOPIC)
        except OutboxError:
            return None
        since_back = time.monotonic() - self.start_at
        key = ";".join(f"{t.producer_id}/{t.producer_epoch}@{t.first_offset}" for t in held)
        orphan = any(t.idle_seconds > since_back + 1 for t in held)
        return key, "; ".join(t.describe() for t in held) or "no open transaction", orphan

    def text(self) -> str:
        return "".join(f"+{at:7.1f} s  {what}\n" for at, what in self.entries)

    def stop(self) -> None:
        self.stopping.set()
        self.join(timeout=30)


class ExitWatch(threading.Thread):
    """PostgreSQL, the broker, Connect (and the relay), every half second: one that is not
    running while no fault or restart of this run acts on it (:attr:`planned`) exited
    unplanned. ``explain``: how a component other than the services tells how it ended."""

    def __init__(
        self,
        components: dict[str, Callable[[], bool]],
        pids: dict[str, ServiceProcess],
        explain: dict[str, Callable[[], str]] | None = None,
    ):
        super().__init__(name="cdc-recovery-exits", daemon=True)
        self.components = components
        self.pids = pids
        self.explain = explain or {}
        self.planned: set[str] = set()
        self.exits: list[str] = []
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self._down: set[str] = set()

    @contextlib.contextmanager
    def planning(self, *names: str) -> Iterator[None]:
        with self.lock:
            self.planned.update(names)
        try:
            yield
        finally:
            with self.lock:
                self.planned.difference_update(names)

    def run(self) -> None:
        while not self.stopping.is_set():
            for name, running in self.components.items():
                with self.lock:
                    if name in self.planned:
                        self._down.discard(name)
                        continue
                    if running():
                        self._down.discard(name)
                        continue
                    if name in self._down:
                        continue
                    self._down.add(name)
                self.record(name, self._how(name))
            self.stopping.wait(0.5)

    def record(self, name: str, how: str) -> None:
        with self.lock:
            self.exits.append(f"{time.strftime('%H:%M:%S')} {name}: {how}")

    def _how(self, name: str) -> str:
        if name in self.explain:
            return self.explain[name]()
        process = self.pids.get(name)
        if process is None:
            return "not running"
        try:
            pid = int(process.pid_file.read_text().strip())
        except (OSError, ValueError):
            return "not running (no pid file)"
        cause = [line for line in process.tail(200) if " ERROR " in line][-1:]
        return exit_status(pid) + (f"; last error: {cause[0][:200]}" if cause else "")

    def stop(self) -> None:
        self.stopping.set()
        self.join(timeout=10)


# --- evidence ------------------------------------------------------------------------------


class Evidence:
    """What a stalled round leaves: into ``folder``, one file each."""

    def __init__(self, services: KafkaServices, connector: ConnectorSettings, folder: Path) -> None:
        self.services = services
        self.connector = connector
        self.folder = folder
        self.java = shutil.which(str(services.settings.java)) or "java"
        self.classpath = java_classpath(services.settings.downloads_root, "broker")

    def _write(self, name: str, text: str) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        (self.folder / name).write_text(text)

    def _run(self, command: list[str], timeout: float = 90) -> str:
        try:
            done = subprocess.run(
                command, capture_output=True, text=True, timeout=timeout, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as error:
            return f"$ {' '.join(command[-6:])}\n{type(error).__name__}: {error}\n"
        return f"$ ... {' '.join(command[-6:])} (exit {done.returncode})\n{done.stdout}" + (
            f"\n--- stderr:\n{done.stderr[-4000:]}" if done.stderr.strip() else ""
        )

    def kafka_tool(self, main: str, *arguments: str) -> str:
        """A Kafka command-line tool (``kafka-transactions.sh``...) of the broker's jars."""
        bootstrap = ["--bootstrap-server", self.services.bootstrap_servers]
        return self._run(
            [self.java, "-Xmx256m", "-cp", self.classpath, main, *bootstrap, *arguments]
        )

    def thread_dump(self, process: ServiceProcess, name: str) -> None:
        pid = process.pid()
        if pid is None:
            self._write(name, f"{process.name} is not running\n")
            return
        self._write(name, self._run(["jcmd", str(pid), "Thread.print", "-l"], timeout=60))

    def collect(
        self, tag: str, log_offsets: dict[str, int], timeline: Timeline, *, full: bool
    ) -> None:
        """Files named with ``tag``: thread dumps (Connect's twice, 5 s apart: held, or
        moving?), the timeline, REST, the slot, the transactions open on Connect's topics;
        ``full``: also the broker's thread dump, Kafka's tools on transactions and groups,
        both logs since the round began."""
        connect = self.services.connect
        self.thread_dump(connect.process, f"{tag}-connect-threads-1.txt")
        self._write(f"{tag}-timeline.txt", timeline.text())
        self._write(f"{tag}-rest.txt", self._rest())
        self._write(f"{tag}-slot.txt", self._slot())
        self._write(f"{tag}-open-transactions.txt", self._open_transactions())
        time.sleep(5)
        self.thread_dump(connect.process, f"{tag}-connect-threads-2.txt")
        if not full:
            return
        self.thread_dump(self.services.broker.process, f"{tag}-broker-threads.txt")
        self._write(f"{tag}-transactions.txt", self._transactions())
        self._write(f"{tag}-groups.txt", self._groups())
        for process in (connect.process, self.services.broker.process):
            self._write(f"{tag}-{process.name}.log", _log_since(process, log_offsets))

    def final(self, timeline: Timeline, log_offsets: dict[str, int]) -> None:
        """At the round's end: its whole timeline and both logs since it began."""
        self._write("timeline.txt", timeline.text())
        for process in (self.services.connect.process, self.services.broker.process):
            self._write(f"{process.name}.log", _log_since(process, log_offsets))

    def _open_transactions(self) -> str:
        """What ``outbox connect status`` sees open on each of Connect's topics."""
        found = []
        for topic in CONNECT_TOPICS:
            try:
                held = open_transactions(self.services.kafka, topic)
                described = "; ".join(t.describe() for t in held) or "none"
            except OutboxError as error:
                described = f"not checked: {error}"
            found.append(f"open on {topic}: {described}\n")
        return "".join(found)

    def _rest(self) -> str:
        client = ConnectClient(self.services.connect.rest_url, timeout=10)
        name = self.connector.name
        found = []
        for path in (
            "/",
            "/connectors?expand=status&expand=info",
            f"/connectors/{name}/status",
            f"/connectors/{name}/tasks",
            f"/connectors/{name}/offsets",
        ):
            try:
                answer = json.dumps(client.request("GET", path), indent=1)
            except Exception as error:  # what REST answered, whatever it is, is the evidence
                answer = f"{type(error).__name__}: {error}"
                if hasattr(error, "read"):
                    answer += f" {error.read().decode(errors='replace')[:2000]}"
            found.append(f"GET {path}\n{answer}\n")
        return "\n".join(found)

    def _transactions(self) -> str:
        tool = "org.apache.kafka.tools.TransactionsCommand"
        listing = self.kafka_tool(tool, "list")
        found = [listing]
        found += [
            self.kafka_tool(tool, "describe", "--transactional-id", transactional_id)
            for transactional_id in transactional_ids(listing)
        ]
        found.append(self.kafka_tool(tool, "find-hanging", "--broker-id", str(NODE_ID)))
        for topic in CONNECT_TOPICS:
            found.append(self.kafka_tool(tool, "find-hanging", "--topic", topic))
            found.append(
                self.kafka_tool(tool, "describe-producers", "--topic", topic, "--partition", "0")
            )
        return "\n".join(found)

    def _groups(self) -> str:
        return "\n".join(
            [
                self.kafka_tool("org.apache.kafka.tools.GroupsCommand", "--list"),
                self.kafka_tool(
                    "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand",
                    "--describe",
                    "--all-groups",
                    "--state",
                ),
            ]
        )

    def _slot(self) -> str:
        try:
            with psycopg.connect(self.services.cluster.conninfo(), connect_timeout=5) as db:
                slots = db.execute("SELECT * FROM pg_replication_slots").fetchall()
                senders = db.execute("SELECT * FROM pg_stat_replication").fetchall()
        except psycopg.Error as error:
            return f"{type(error).__name__}: {error}\n"
        return (
            "pg_replication_slots:\n"
            + "".join(f"{row}\n" for row in slots)
            + ("pg_stat_replication:\n" + "".join(f"{row}\n" for row in senders))
        )


def _log_offsets(*processes: ServiceProcess) -> dict[str, int]:
    return {
        process.name: process.log_file.stat().st_size if process.log_file.exists() else 0
        for process in processes
    }


def _log_since(process: ServiceProcess, offsets: dict[str, int]) -> str:
    if not process.log_file.exists():
        return ""
    with process.log_file.open("rb") as log:
        log.seek(offsets.get(process.name, 0))
        return log.read().decode(errors="replace")


# --- the run -------------------------------------------------------------------------------


@dataclass
class Run:
    services: KafkaServices
    database: ScratchDatabase
    connector: ConnectorSettings
    writer: LoadWriter
    watch: ExitWatch
    folder: Path
    bound: float
    give_up: float
    dump_after: float
    aim: bool
    relay: RelayRunner | None = None
    results: list[RoundResult] = field(default_factory=list)
    aborted: str | None = None
    probes: list[Committed] = field(default_factory=list)
    """The probes whose commit was acknowledged, in commit order."""
    probes_unknown: set[str] = field(default_factory=set)

    @property
    def client(self) -> ConnectClient:
        return ConnectClient(self.services.connect.rest_url, timeout=10)

    def slot_text(self) -> str:
        try:
            with psycopg.connect(self.services.cluster.conninfo(), connect_timeout=5) as db:
                row = db.execute(
                    "SELECT active, confirmed_flush_lsn FROM pg_replication_slots "
                    "WHERE slot_name = %s",
                    (self.connector.slot_name,),
                ).fetchone()
        except psycopg.Error as error:
            return f"unknown ({type(error).__name__})"
        if row is None:
            return "no slot"
        return f"{'active' if row[0] else 'inactive'}, confirmed up to {row[1]}"

    def ensure_running(self, result: RoundResult) -> None:
        """Before a round: every component runs (one that exited unplanned was recorded by
        the watch; it is started again here, as a supervisor would)."""
        if not self.services.broker.process.is_running():
            self.services.broker.up()
            result.notes.append("the broker was not running: started again")
        if not self.services.connect.process.is_running():
            self._start_connect(result)
            result.notes.append("Connect was not running: started again")
        if self.relay is not None and not self.relay.running():
            self.relay.start()
            result.notes.append("the relay was not running: started again")

    def _start_connect(self, result: RoundResult) -> None:
        """Start Connect and wait for its REST API; again while it exits during start-up (an
        unplanned exit, recorded)."""
        for _ in range(3):
            try:
                self.services.start_connect()
                return
            except StackError as error:
                if self.services.connect.process.is_running():
                    result.notes.append(f"Connect's REST did not answer: {str(error)[:200]}")
                    return  # running but not answering: the probe's wait says the rest
                cause = [
                    line for line in self.services.connect.process.tail(60) if " ERROR " in line
                ]
                self.watch.record(
                    "Connect", "exited during start-up" + (f": {cause[-1][:200]}" if cause else "")
                )

    def round(self, planned: PlannedRound) -> RoundResult:
        result = RoundResult(planned, bound_seconds=self.bound, by_cdc=self.relay is not None)
        self.ensure_running(result)
        services = self.services
        offsets = _log_offsets(services.connect.process, services.broker.process)
        relay_before = relay_log = None
        if self.relay is not None:
            relay_before = self.relay.counters(UNBLOCKED, TAKEOVERS)
            relay_log = self.relay.log_size()
        time.sleep(planned.settle_seconds)
        if planned.kind is FaultKind.KILL:
            if self.aim:
                aimed = wait_for_open_offsets(services.kafka, timeout=60)
                result.notes.append(
                    f"aimed: killed once a transaction was seen open on {OFFSETS_TOPIC}"
                    if aimed
                    else f"aimed, but no transaction seen open on {OFFSETS_TOPIC} in 60 s"
                )
            with self.watch.planning("broker", "Connect"):
                for process in (services.broker.process, services.connect.process):
                    _kill(process)
                time.sleep(planned.hold_seconds)
                restarted = time.monotonic()
                services.broker.up()
                result.broker_ready_seconds = time.monotonic() - restarted
                broker_back = time.monotonic()
                self._start_connect(result)
                result.connect_ready_seconds = time.monotonic() - broker_back
        else:
            services.broker.process.signal(signal.SIGSTOP)
            try:
                time.sleep(planned.hold_seconds)
            finally:
                services.broker.process.signal(signal.SIGCONT)
        back = time.monotonic()
        timeline = Timeline(
            self.client, self.connector.name, self.slot_text, self.services.kafka, back
        )
        timeline.start()
        try:
            self._probe(result, back, offsets, timeline, relay_log)
        finally:
            timeline.stop()
            result.held_by = timeline.held_by
            result.offsets_reads = offsets_reads(
                _log_since(services.connect.process, offsets).splitlines()
            )
            if self.relay is not None and relay_log is not None:
                self._relay_round(result, relay_before, relay_log)
        return result

    def _relay_round(
        self, result: RoundResult, before: dict[str, float] | None, log_offset: int
    ) -> None:
        """Whether the relay unblocked Connect and took over during the round: its counters'
        growth (unknown when its metrics did not answer, or it started again meanwhile), and
        its own words from its log."""
        assert self.relay is not None
        after = self.relay.counters(UNBLOCKED, TAKEOVERS)
        if before is not None and after is not None and after[UNBLOCKED] >= before[UNBLOCKED]:
            result.unblocked = int(after[UNBLOCKED] - before[UNBLOCKED])
            result.took_over = after[TAKEOVERS] > before[TAKEOVERS]
        said = unblock_lines(self.relay.log_since(log_offset))
        result.notes += [f"relay: {line}" for line in said]
        if result.unblocked is None and said:
            result.unblocked = len(said)

    def _probe(
        self,
        result: RoundResult,
        back: float,
        offsets: dict[str, int],
        timeline: Timeline,
        relay_log: int | None,
    ) -> None:
        """Commit the round's probe and wait for it on Kafka (with the relay: and for CDC to
        confirm its WAL). Evidence is taken, in threads of its own (the wait's clock runs
        on), at ``--dump-after`` (a slow round: thread dumps, REST, the offsets topic), at the
        bound and at ``--give-up`` (everything); past ``--give-up``, the remedies."""
        number = result.planned.number
        folder = self.folder / f"round-{number:02d}"
        evidence = Evidence(self.services, self.connector, folder)
        takers: list[threading.Thread] = []
        checkpoints = sorted(
            {
                (min(self.dump_after, self.bound), "slow", False),
                (self.bound, "at-bound", True),
                (self.give_up, "at-give-up", True),
            }
        )
        probe: Probe | None = None
        arrived = False
        passed: set[float] = set()
        for limit, tag, full in checkpoints:
            if limit in passed:
                continue  # --dump-after or --give-up equal to the bound: one evidence there
            passed.add(limit)
            if probe is None:
                probe = self.write_probe(number, until=back + limit)
            if probe is not None and self.recovered(probe, until=back + limit):
                arrived = True
                break
            result.evidence = folder
            if tag == "at-bound":
                typer.echo(
                    f"round {number}: {self.waiting_for(probe)} {limit:.0f} s after both back"
                )
            takers.append(
                threading.Thread(
                    target=evidence.collect,
                    args=(tag, offsets, timeline),
                    kwargs={"full": full},
                    daemon=True,
                )
            )
            takers[-1].start()
        if probe is not None and probe.on_kafka is not None and self.relay is not None:
            result.probe_seconds = probe.on_kafka - back
        if arrived:
            result.recovery_seconds = time.monotonic() - back
            if result.recovery_seconds > self.bound:
                result.notes.append(
                    f"CDC came back by itself after {result.recovery_seconds:.0f} s"
                )
        for taker in takers:
            taker.join(timeout=600)
        if result.evidence is not None:
            evidence.final(timeline, offsets)
            if self.relay is not None and relay_log is not None:
                folder.mkdir(parents=True, exist_ok=True)
                (folder / "relay.log").write_text(self.relay.log_since(relay_log))
        if arrived:
            result.readers_held = self._readers_held(back)
            return
        result.notes.append(f"CDC not back by itself after {self.give_up:.0f} s: remedies")
        self._remedy(result)
        probe = self.write_probe(number, until=time.monotonic() + self.give_up)
        if probe is None or not self.recovered(probe, until=time.monotonic() + self.give_up):
            self.aborted = f"round {number}: CDC did not come back even after the remedies"
        else:
            result.readers_held = self._readers_held(back)

    def recovered(self, probe: Probe, *, until: float) -> bool:
        """Whether ``probe`` is on Kafka by ``until`` (monotonic); with the relay (which may
        deliver it itself), also whether CDC confirmed the WAL written up to its commit."""
        if probe.on_kafka is None:
            if not wait_for_probe(self.services.bootstrap_servers, probe.event_id, until=until):
                return False
            probe.on_kafka = time.monotonic()
        if probe.wal is None:
            return True
        return wait_for_slot(
            self.database.conninfo, self.connector.slot_name, probe.wal, until=until
        )

    def waiting_for(self, probe: Probe | None) -> str:
        if probe is None:
            return "no probe committed"
        if probe.on_kafka is None:
            return "no probe on Kafka"
        return "CDC has not confirmed the probe's WAL"

    def _readers_held(self, back: float) -> list[str]:
        """Transactions open since before ``back`` on the outbox's topics, still open after
        :data:`READERS_GRACE_SECONDS`, described."""
        deadline = time.monotonic() + READERS_GRACE_SECONDS
        while True:
            held = []
            for topic in (topic_for(LOAD_TYPE), topic_for(PROBE_TYPE)):
                try:
                    found = open_transactions(self.services.kafka, topic)
                except OutboxError as error:
                    found = []
                    held.append(f"{topic}: not checked: {error}")
                since = time.monotonic() - back
                held += [t.describe() for t in found if t.idle_seconds > since + 1]
            if not held or time.monotonic() > deadline:
                return held
            time.sleep(2)

    def write_probe(self, number: int, *, until: float) -> Probe | None:
        """Commit a probe of round ``number`` (again while PostgreSQL refuses, until
        ``until``); with the relay, with the WAL written up to its commit. None: no probe
        committed by ``until``."""
        while True:
            event = probe_event(number)
            try:
                commit_probe(self.database.conninfo, event)
            except psycopg.OperationalError:
                self.probes_unknown.add(str(event.event_id))
                if time.monotonic() > until:
                    return None
                time.sleep(1)
                continue
            self.probes.append(Committed(str(event.event_id), PROBE_TYPE, event.aggregate_id))
            if self.relay is None:
                return Probe(event.event_id, None)
            while True:
                try:
                    return Probe(event.event_id, current_wal(self.database.conninfo))
                except psycopg.OperationalError:
                    if time.monotonic() > until:
                        return None
                    time.sleep(1)

    def _remedy(self, result: RoundResult) -> None:
        """What an operator does (docs/troubleshooting.md), in order, each said."""
        name = self.connector.name
        with contextlib.suppress(ConnectError, OSError):
            state = self.client.state(name)
            if state is not None and (state.failed_tasks or state.connector == "FAILED"):
                self.client.restart(name)
                result.notes.append("remedy: failed connector/task restarted")
                return
        try:
            aborted = self.services.unblock_connect()
        except OutboxError as error:
            aborted = []
            result.notes.append(f"remedy: unblock failed: {error}")
        if aborted:
            described = "; ".join(t.describe() for t in aborted)
            result.notes.append(f"remedy: hanging transaction aborted: {described}")
            return
        with self.watch.planning("Connect"):
            self.services.connect.down()
            self._start_connect(result)
        result.notes.append("remedy: Connect restarted")


def _postmaster_running(cluster: PostgresCluster) -> bool:
    """Cheaper than ``is_running`` (``pg_ctl status``), twice a second."""
    pid = cluster.pid()
    return pid is not None and Path(f"/proc/{pid}").exists()


def _kill(process: ServiceProcess) -> None:
    process.signal(signal.SIGKILL)
    deadline = time.monotonic() + 30
    while process.is_running():
        if time.monotonic() > deadline:
            raise StackError(f"{process.name} still running 30 s after SIGKILL")
        time.sleep(0.05)


def wait_for_open_offsets(kafka: KafkaSettings, *, timeout: float) -> bool:
    """Wait until a transaction is open on Connect's offsets topic (a task writes its
    offsets last in each transaction, just before its commit: the window in which a kill
    leaves the worker's start-up read held); False if none was seen within ``timeout``."""
    from kafka import KafkaAdminClient, TopicPartition

    partition = TopicPartition(OFFSETS_TOPIC, 0)
    admin = open_client(kafka, KafkaAdminClient, client_options(kafka, client_id="cdc-aim"))
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            with kafka_errors(kafka):
                state = admin.describe_producers([partition])[partition]
            if any(p.current_transaction_start_offset >= 0 for p in state.active_producers):
                return True
    finally:
        admin.close()
    return False


def override(target: type, method: str, properties: dict[str, str]) -> None:
    """``target.method()`` (a properties dict) with ``properties`` on top, in this process:
    a candidate setting tried on the rounds before it goes into the stack's code."""
    original = getattr(target, method)

    def patched(self: object) -> dict[str, str]:
        return {**original(self), **properties}

    setattr(target, method, patched)


def properties(given: list[str]) -> dict[str, str]:
    """``KEY=VALUE`` options as a dict (a ``typer.BadParameter`` for any other text)."""
    found = {}
    for text in given:
        key, equals, value = text.partition("=")
        if not equals or not key.strip():
            raise typer.BadParameter(f"{text!r}: expected KEY=VALUE")
        found[key.strip()] = value.strip()
    return found


def _raise_logging() -> None:
    """The services' log4j2 text, with the loggers the evidence needs (see the module)."""
    connect_module._LOG4J2 = debug_log4j2(connect_module._LOG4J2, CONNECT_DEBUG_LOGGERS)
    broker_module._LOG4J2 = debug_log4j2(broker_module._LOG4J2, BROKER_DEBUG_LOGGERS)


def _start_stack(
    folder: Path, relay_password: str
) -> tuple[KafkaServices, ScratchDatabase, ConnectorSettings]:
    """A fresh PostgreSQL, broker and Connect in ``folder`` (an earlier run's are deleted), a
    migrated database, a CDC role, a relay role (:data:`RELAY_ROLE`, ``relay_password``) and
    the connector as the broker-fault tests have them (``tests/fix_cdc.py``: heartbeat every
    second, PostgreSQL's certificate verified)."""
    cluster = PostgresCluster(StackSettings(dir=folder, postgres_port=free_port()))
    cluster.destroy()
    cluster.up()
    services = started_services(cluster, stack_settings(folder, cluster.port))
    services.start_connect()
    database = ScratchDatabase(cluster, DATABASE)
    cluster.ensure_database(database.name)
    connector = ConnectorSettings(
        url=services.connect.rest_url,
        name="cdc-recovery",
        database_port=cluster.port,
        database_name=database.name,
        database_user="cdc_recovery",
        slot_name="cdc_recovery_slot",
        topic_prefix="cdcrecovery",
        heartbeat_interval_ms=1000,
        database_sslmode="verify-full",
        database_sslrootcert=str(cluster.ca_file),
    )
    engine = sa.create_engine(database.url)
    try:
        with engine.begin() as connection:
            outbox_migrations.upgrade(connection)
            outbox_migrations.create_cdc_role(
                connection, connector.database_user, services.cdc_password
            )
            outbox_migrations.create_relay_role(connection, RELAY_ROLE, relay_password)
    finally:
        engine.dispose()
    client = ConnectClient(connector.url)
    client.apply(connector.name, render_connector_config(connector, OutboxSettings()))
    client.wait_running(connector.name, timeout=120)
    return services, database, connector


def _stop_stack(services: KafkaServices | None, cluster: PostgresCluster) -> None:
    if services is not None:
        with contextlib.suppress(StackError):
            services.broker.process.signal(signal.SIGCONT)  # a paused broker stops only so
        services.connect.down()
        services.broker.down()
    cluster.down()


@dataclass(frozen=True)
class Options:
    rounds: int
    kinds: Kinds
    seed: int
    bound: float
    give_up: float
    dump_after: float
    rate: float
    aim: bool
    down: float | None
    folder: Path
    relay: bool = False
    lake: bool = False


def _relay(
    services: KafkaServices,
    database: ScratchDatabase,
    connector: ConnectorSettings,
    password: str,
    log: Path,
) -> RelayRunner:
    """The relay as operators run it: auto mode, as its own role, the connector's topic
    prefix (its CDC heartbeat topic), Connect's offsets topic (which it unblocks), the
    default unblock idle time."""
    port = free_port()
    return RelayRunner(
        {
            "OUTBOX_DATABASE_URL": services.cluster.url(
                database.name, role=RELAY_ROLE, password=password
            ),
            "OUTBOX_KAFKA_BOOTSTRAP_SERVERS": services.bootstrap_servers,
            "OUTBOX_RELAY_MODE": "auto",
            "OUTBOX_CONNECT_TOPIC_PREFIX": connector.topic_prefix,
            "OUTBOX_RELAY_CONNECT_OFFSETS_TOPIC": OFFSETS_TOPIC,
            "OUTBOX_RELAY_GRACE_SECONDS": f"{RELAY_GRACE_SECONDS:g}",
            "OUTBOX_RELAY_HTTP_PORT": str(port),
        },
        log,
        port,
    )


def _drain(the_run: Run) -> str | None:
    """After the writer stopped: wait (up to :data:`DRAIN_SECONDS`) until the outbox is
    empty (everything delivered, by CDC or the relay) and CDC confirmed the WAL written up to
    now. None when done, else what was left."""
    conninfo = the_run.database.conninfo
    deadline = time.monotonic() + DRAIN_SECONDS
    left = -1
    try:
        wal = current_wal(conninfo)
        while time.monotonic() < deadline:
            with psycopg.connect(conninfo, connect_timeout=5) as connection:
                row = connection.execute("SELECT count(*) FROM outbox.outbox").fetchone()
            left = int(row[0]) if row is not None else -1
            if left == 0:
                break
            time.sleep(1)
        confirmed = wait_for_slot(conninfo, the_run.connector.slot_name, wal, until=deadline)
    except psycopg.Error as error:
        return f"not checked: {type(error).__name__}: {error}"
    problems = []
    if left != 0:
        problems.append(f"{left} rows still in the outbox")
    if not confirmed:
        problems.append("CDC did not confirm the last WAL")
    return f"after {DRAIN_SECONDS:.0f} s: " + ", ".join(problems) if problems else None


def _check_lake(the_run: Run, writer: LoadWriter) -> LakeCheck | str:
    """The lake job once over the run's topics, its ``events`` table against the committed
    events: the comparison, or why there is none."""
    root = the_run.folder / "lake"
    services = the_run.services
    typer.echo(f"lake: ingesting {LAKE_TOPIC_PATTERN} into {root}")
    started = time.monotonic()
    code, said = run_lake(
        root,
        services.bootstrap_servers,
        services.settings.downloads_root,
        the_run.folder / "lake-ingest.log",
        LAKE_TIMEOUT_SECONDS,
    )
    typer.echo(f"lake: {said} ({time.monotonic() - started:.0f} s, exit {code})")
    if code != 0:
        return f"lake ingest failed (exit {code}): see {the_run.folder / 'lake-ingest.log'}"
    try:
        found = lake_events(root)
    except Exception as error:  # whatever deltalake raises: no table is the finding
        return f"lake's events table not read: {type(error).__name__}: {error}"
    committed = writer.events + the_run.probes
    return compare_lake(committed, writer.unknown | the_run.probes_unknown, found)


def run(options: Options) -> int:
    """The whole run; its exit status."""
    plan = plan_rounds(options.rounds, kinds=options.kinds, seed=options.seed, down=options.down)
    folder, bound = options.folder, options.bound
    typer.echo(
        f"cdc_recovery: {options.rounds} rounds ({options.kinds}), seed {options.seed}, "
        f"bound {bound:.0f} s, "
        + (
            f"relay in auto mode (unblock idle {UNBLOCK_IDLE_SECONDS:.0f} s), judged by CDC "
            "confirming the probe's WAL, "
            if options.relay
            else "no relay, "
        )
        + ("lake checked at the end, " if options.lake else "")
        + f"stack {folder}"
    )
    cluster = PostgresCluster(StackSettings(dir=folder, postgres_port=free_port()))
    services: KafkaServices | None = None
    relay: RelayRunner | None = None
    relay_password = secrets.token_urlsafe(24)
    evidence = folder / "evidence" / f"{time.strftime('%Y%m%d-%H%M%S')}-seed{options.seed}"
    try:
        try:
            services, database, connector = _start_stack(folder, relay_password)
            cluster = services.cluster
        except (OutboxError, StackError, AssertionError, OSError) as error:
            typer.echo(f"error: the stack did not come up: {type(error).__name__}: {error}")
            return 2
        if options.relay:
            relay = _relay(services, database, connector, relay_password, evidence / "relay.log")
            relay.start()
            if not relay.wait_leading(timeout=90):
                typer.echo(f"error: the relay does not lead within 90 s: {relay.how()}")
                return 2
            typer.echo(f"relay: leading (pid {relay.process.pid if relay.process else None})")
        writer = LoadWriter(database.conninfo, options.rate)
        components: dict[str, Callable[[], bool]] = {
            "PostgreSQL": functools.partial(_postmaster_running, cluster),
            "broker": services.broker.process.is_running,
            "Connect": services.connect.process.is_running,
        }
        explain: dict[str, Callable[[], str]] = {}
        if relay is not None:
            components["relay"] = relay.running
            explain["relay"] = relay.how
        watch = ExitWatch(
            components,
            {"broker": services.broker.process, "Connect": services.connect.process},
            explain,
        )
        the_run = Run(
            services,
            database,
            connector,
            writer,
            watch,
            evidence,
            options.bound,
            options.give_up,
            options.dump_after,
            options.aim,
            relay,
        )
        writer.start()
        watch.start()
        drained: str | None = None
        try:
            start = time.monotonic()
            probe = the_run.write_probe(0, until=start + bound)
            if probe is None or not the_run.recovered(probe, until=start + bound):
                typer.echo(
                    f"error: CDC delivers no probe within {bound:.0f} s of the start: "
                    + the_run.waiting_for(probe)
                )
                return 2
            typer.echo(f"CDC delivers: first probe after {time.monotonic() - start:.1f} s")
            for planned in plan:
                try:
                    result = the_run.round(planned)
                except (OutboxError, StackError) as error:
                    the_run.aborted = f"round {planned.number}: {type(error).__name__}: {error}"
                    break
                the_run.results.append(result)
                typer.echo(result.line())
                if the_run.aborted:
                    break
        finally:
            writer.stopping.set()
            writer.join(timeout=30)
            if relay is not None or options.lake:
                drained = _drain(the_run)
            watch.stop()
        exits = list(watch.exits)
        if relay is not None:
            stopped = relay.stop()
            if stopped != 0:
                exits.append(
                    "relay: "
                    + ("did not stop within 60 s of SIGTERM" if stopped is None else relay.how())
                )
            else:
                typer.echo("relay: stopped cleanly (exit 0)")
        for line in summary_lines(
            the_run.results, exits=exits, writer=writer.describe(), planned=len(plan)
        ):
            typer.echo(line)
        if drained is not None:
            typer.echo(f"drain: {drained}")
        lake_ok = True
        if options.lake:
            checked = _check_lake(the_run, writer)
            if isinstance(checked, str):
                typer.echo(f"lake: FAILED: {checked}")
                lake_ok = False
            else:
                typer.echo(checked.line())
                for line in checked.details():
                    typer.echo(line)
                lake_ok = checked.ok
        if the_run.aborted:
            typer.echo(f"aborted: {the_run.aborted}")
        failed = (
            the_run.aborted
            or len(the_run.results) < len(plan)
            or not all(r.ok for r in the_run.results)
            or exits
            or writer.errors
            or not lake_ok
        )
        return 1 if failed else 0
    finally:
        if relay is not None:
            relay.kill()
        _stop_stack(services, cluster)


app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)


@app.command()
def main(
    rounds: int = typer.Option(10, min=1, help="Rounds of faults."),
    kinds: Annotated[
        Kinds,
        typer.Option(help="kill: kill rounds only; pause: pause rounds only; both: alternate."),
    ] = Kinds.KILL,
    pauses: bool = typer.Option(
        False, help="Every other round pauses the broker instead (the same as --kinds both)."
    ),
    seed: int | None = typer.Option(None, help="Seed of the rounds' timings (random: printed)."),
    relay: bool = typer.Option(
        False,
        help="Run our relay in auto mode all along (as operators run it); a round then "
        "recovers when CDC itself confirms the WAL written up to its probe's commit (the "
        "connector's slot), the probe on Kafka by either path.",
    ),
    lake: bool | None = typer.Option(
        None,
        help="At the end, ingest the run's topics into a lake once and check that it holds "
        "every committed event exactly once (default: on with --relay).",
    ),
    bound: float | None = typer.Option(
        None,
        min=10,
        help=f"Seconds CDC has, after both are back (default {BOUND_SECONDS:.0f}; with "
        f"--relay {RELAY_BOUND_SECONDS:.0f}: the relay's unblock idle time, "
        f"{UNBLOCK_IDLE_SECONDS:.0f} s, plus its look every 15 s, plus Connect's restart of "
        "the task).",
    ),
    give_up: float = typer.Option(
        600.0, min=10, help="Seconds a stalled round waits for CDC by itself before remedies."
    ),
    rate: float = typer.Option(
        50.0, min=1, max=5000, help="Events a second the writer commits all along."
    ),
    down: float | None = typer.Option(
        None, min=0, help="Seconds both stay dead in a kill round (default: 1 to 5)."
    ),
    dump_after: float = typer.Option(
        30.0, min=1, help="Seconds after which a waiting round's thread dumps are taken."
    ),
    aim: bool = typer.Option(
        False, help=f"Kill once a transaction is seen open on {OFFSETS_TOPIC} (the hold's window)."
    ),
    connect_property: Annotated[
        list[str] | None,
        typer.Option(help="KEY=VALUE added to Connect's worker.properties (a candidate fix)."),
    ] = None,
    broker_property: Annotated[
        list[str] | None,
        typer.Option(help="KEY=VALUE added to the broker's server.properties (a candidate)."),
    ] = None,
    debug_logs: bool = typer.Option(True, help="Raise the broker's and Connect's logging."),
    folder: str | None = typer.Option(
        None, "--dir", help="The stack's own folder (.stack/cdc-recovery; made again)."
    ),
) -> None:
    """Kill the broker and Connect (or pause the broker), round after round, and measure how
    long CDC takes to deliver a fresh event by itself (with --relay: with our relay running in
    auto mode; bound 180 s by default = unblock idle 60 s + 15 s look + Connect's restart)."""
    if pauses and kinds is not Kinds.KILL and kinds is not Kinds.BOTH:
        raise typer.BadParameter("--pauses is --kinds both: give one of them")
    if pauses:
        kinds = Kinds.BOTH
    chosen_bound = bound if bound is not None else RELAY_BOUND_SECONDS if relay else BOUND_SECONDS
    if debug_logs:
        _raise_logging()
    if connect_property:
        override(ConnectWorker, "worker_properties", properties(connect_property))
    if broker_property:
        override(KafkaBroker, "server_properties", properties(broker_property))
    chosen = seed if seed is not None else secrets.randbelow(1_000_000)
    raise typer.Exit(
        run(
            Options(
                rounds=rounds,
                kinds=kinds,
                seed=chosen,
                bound=chosen_bound,
                give_up=max(give_up, chosen_bound),
                dump_after=dump_after,
                rate=rate,
                aim=aim,
                down=down,
                folder=Path(folder).resolve() if folder else DEFAULT_DIR,
                relay=relay,
                lake=relay if lake is None else lake,
            )
        )
    )


if __name__ == "__main__":
    app()
