"""The overview's panels: each component's state and facts, read through what the project
already has (no check is written twice here):

- PostgreSQL and the slot: :func:`outbox_connect.status.read_slot_state` (``connect
  status``);
- Connect, the connector and its tasks, its offsets topic:
  :func:`outbox_connect.status.read_connect_status` (``connect status``);
- the relays: their ``/readyz`` and ``/metrics`` (:mod:`outbox_relay.probe`, as ``relay
  health``): leader, publishing or standing by, the backlog and its age;
- the broker: Kafka's admin API, through the project's client layer
  (:mod:`outbox.kafka_clients`);
- the lake: :func:`outbox_lake.query.freshness` (``lake tables``), and the job's own
  ``/metrics`` when its address is set (last batch, lag per partition);
- reconcile: the metrics file ``outbox reconcile --metrics-file`` writes.

A reader raises when its component does not answer; :class:`outbox_console.watch.Watch`
turns that into a panel that says so, with the reason.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from outbox_relay.slices import SLICES

if TYPE_CHECKING:
    from outbox.settings import KafkaSettings, OutboxSettings
    from outbox_connect.settings import ConnectorSettings
    from outbox_connect.status import ConnectStatus
    from outbox_console.settings import ConsoleSettings
    from outbox_lake.settings import LakeSettings
    from outbox_relay.probe import Sample

__all__ = [
    "Fact",
    "Panel",
    "Pipeline",
    "RelayView",
    "broker_panel",
    "connect_panel",
    "delivery_path",
    "lake_panel",
    "postgres_panel",
    "reconcile_panel",
    "relay_panel",
]

OK, WARN, DOWN, SLOW, WAITING = "ok", "warn", "down", "slow", "waiting"


@dataclass(frozen=True)
class Fact:
    label: str
    value: str
    tone: str = ""
    """``ok``, ``warn``, ``down`` or empty."""
    note: str = ""
    """Advice shown folded under the value."""


@dataclass(frozen=True)
class Panel:
    """One component as last read: its state (``ok``, ``warn``, ``down``; ``slow``: no
    answer within the console's patience; ``waiting``: not read yet), one line, its facts."""

    name: str
    state: str
    summary: str
    facts: list[Fact] = field(default_factory=list)
    read_at: float = field(default_factory=time.time)
    detail: Any = None
    """What the reader found, as the project's own type (for the delivery path)."""


@dataclass(frozen=True)
class Pipeline:
    """Every component's settings, resolved once when the console starts."""

    console: ConsoleSettings
    database_url: str
    outbox: OutboxSettings
    connector: ConnectorSettings
    kafka: KafkaSettings
    lake: LakeSettings


def _bytes(count: int) -> str:
    size = float(count)
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{count:,} bytes" if unit == "bytes" else f"{size:,.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def ago(moment: datetime | float | None, now: float | None = None) -> str:
    """``12 s ago``, ``3 min ago``, ``never``."""
    if moment is None:
        return "never"
    stamp = moment.timestamp() if isinstance(moment, datetime) else moment
    seconds = max(0.0, (now if now is not None else time.time()) - stamp)
    if seconds < 120:
        return f"{seconds:,.0f} s ago"
    if seconds < 7200:
        return f"{seconds / 60:,.0f} min ago"
    return f"{seconds / 3600:,.1f} h ago"


# -- PostgreSQL and the slot --------------------------------------------------------------------


def postgres_panel(pipeline: Pipeline) -> Panel:
    from outbox_connect.status import read_slot_state

    slot = read_slot_state(
        pipeline.database_url,
        pipeline.connector.slot_name,
        timeout_seconds=pipeline.console.answer_seconds,
    )
    bound = Fact(
        "max_slot_wal_keep_size",
        "unlimited" if slot.unbounded else slot.max_slot_wal_keep_size,
        WARN if slot.unbounded else "",
        note=slot.lines()[1],  # the advice of `connect status`
    )
    if slot.state is None:
        return Panel(
            "PostgreSQL",
            WARN,
            f"up; slot {slot.name} missing (the connector creates it)",
            [bound],
            detail=slot,
        )
    active = slot.state == "active"
    facts = [
        Fact("slot", f"{slot.name}: {slot.state}", OK if active else WARN),
        Fact("retained WAL (lag)", _bytes(slot.retained_wal_bytes)),
        Fact("wal_status", slot.wal_status, DOWN if slot.wal_status == "lost" else ""),
        bound,
    ]
    summary = f"up; slot {slot.state}, retains {_bytes(slot.retained_wal_bytes)} of WAL"
    return Panel("PostgreSQL", OK if active else WARN, summary, facts, detail=slot)


# -- Kafka Connect ------------------------------------------------------------------------------


def connect_panel(pipeline: Pipeline) -> Panel:
    from outbox_connect.status import read_connect_status

    status = read_connect_status(
        pipeline.connector, pipeline.kafka, timeout_seconds=pipeline.console.answer_seconds
    )
    facts = []
    if status.state is not None:
        facts.append(
            Fact(
                "connector",
                f"{status.name}: {status.state.connector}",
                OK if status.state.connector == "RUNNING" else DOWN,
            )
        )
        for task, task_state, trace in status.state.tasks:
            first = f" ({trace.splitlines()[0][:200]})" if trace else ""
            facts.append(
                Fact(
                    f"task {task}", f"{task_state}{first}", OK if task_state == "RUNNING" else DOWN
                )
            )
    offsets = [  # what `connect status` says of the offsets topic, line for line
        line.strip()
        for line in status.lines()
        if line.startswith(("offsets topic", f"{status.offsets_topic}[", "  a hanging"))
    ]
    facts += [Fact("offsets topic", line, WARN if status.hanging else "") for line in offsets]
    if status.state is None:
        summary, state = f"up; connector {status.name} not created (`outbox connect apply`)", DOWN
    else:
        summary = f"connector {status.name}: {status.state.connector}"
        if status.state.tasks:
            tasks = ", ".join(task_state for _, task_state, _ in status.state.tasks)
            summary += f", tasks {tasks}"
        state = OK if status.ok else (WARN if status.state.running else DOWN)
    return Panel("Kafka Connect", state, summary, facts, detail=status)


# -- the relays ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class RelayView:
    """One relay replica, from its ``/readyz`` and ``/metrics``."""

    url: str
    answered: bool
    ready: bool
    said: str
    """What ``/readyz`` said (``ok: leader: publishing (polling mode)``), or why no answer."""
    mode: str | None = None
    leader: bool = False
    """It publishes some slices of the outbox (several replicas do in polling mode)."""
    slices: float | None = None
    """How many of the 32 slices it publishes (None: a relay from before slices)."""
    publishing: bool = False
    undelivered: float | None = None
    oldest_age_seconds: float | None = None
    dead_letters: float | None = None
    takeovers: float = 0


def _value(samples: list[Sample], name: str, **labels: str) -> float | None:
    for sample in samples:
        if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
            return sample.value
    return None


def read_relay(url: str, timeout_seconds: float) -> RelayView:
    from outbox_relay.probe import probe, scrape

    answer = probe(url, "/readyz", timeout_seconds=timeout_seconds)
    said = answer.body.strip()
    if not answer.answered:
        return RelayView(url, False, False, said)
    samples = scrape(url, timeout_seconds=timeout_seconds)
    mode = next(
        (s.labels.get("mode") for s in samples if s.name == "outbox_relay_mode" and s.value == 1),
        None,
    )
    return RelayView(
        url,
        True,
        answer.ok,
        said,
        mode=mode,
        leader=_value(samples, "outbox_relay_leader") == 1,
        slices=_value(samples, "outbox_relay_slices"),
        publishing=_value(samples, "outbox_relay_publishing") == 1,
        undelivered=_value(samples, "outbox_relay_undelivered_rows"),
        oldest_age_seconds=_value(samples, "outbox_relay_oldest_undelivered_age_seconds"),
        dead_letters=_value(samples, "outbox_relay_dead_letters"),
        takeovers=_value(samples, "outbox_relay_takeovers_total") or 0,
    )


def relay_panel(pipeline: Pipeline) -> Panel:
    return relays_panel(
        [read_relay(url, pipeline.console.answer_seconds) for url in pipeline.console.relay_urls]
    )


def relays_panel(views: list[RelayView]) -> Panel:
    """The relay panel from what each replica said."""
    facts = []
    for view in views:
        if not view.answered:
            facts.append(Fact(view.url, view.said, DOWN))
            continue
        role = "standby"
        if view.leader:
            role = "leader" if view.slices is None else f"leads {view.slices:.0f} slices"
        what = "publishing" if view.publishing else "not publishing"
        tone = OK if view.ready else WARN
        facts.append(Fact(view.url, f"{role}, {what}, {view.mode} mode: {view.said}", tone))
    leader = next((view for view in views if view.leader), None)
    if leader is not None:
        if leader.undelivered is not None:
            age = leader.oldest_age_seconds or 0.0
            facts.append(
                Fact("backlog", f"{leader.undelivered:,.0f} rows, the oldest {age:,.1f} s old")
            )
        if leader.dead_letters:
            facts.append(Fact("dead letters", f"{leader.dead_letters:,.0f}", WARN))
        if leader.takeovers:
            facts.append(Fact("takeovers from CDC", f"{leader.takeovers:,.0f} since it started"))
    answering = [view for view in views if view.answered]
    if not answering:
        return Panel("Relay", DOWN, "no relay answers", facts, detail=views)
    if leader is None:
        return Panel("Relay", WARN, "no replica leads", facts, detail=views)
    leaders = [view for view in answering if view.leader]
    if len(leaders) > 1:
        shares = " + ".join(f"{view.slices or 0:.0f}" for view in leaders)
        summary = f"{len(leaders)} replicas share the slices ({shares})"
    else:
        summary = f"leader {leader.url}: {'publishing' if leader.publishing else 'standing by'}"
    held = sum(view.slices or 0 for view in leaders)
    unheld = SLICES - held if all(view.slices is not None for view in leaders) else 0
    if unheld > 0:
        facts.append(
            Fact(
                "slices",
                f"{unheld:.0f} of {SLICES} held by no replica listed here: their rows wait "
                '(docs/operations.md, "Slices held by no relay")',
                WARN,
            )
        )
    ready = all(view.ready for view in leaders) and unheld <= 0
    return Panel("Relay", OK if ready else WARN, summary, facts, detail=views)


def delivery_path(connect: ConnectStatus | None, relays: list[RelayView] | None) -> Fact:
    """Which path delivers the outbox's events now, from Connect's status (None: Connect did
    not answer) and the relays' views (None or empty: none was read)."""
    leader = next((view for view in relays or [] if view.leader), None)
    connector_runs = connect is not None and connect.state is not None and connect.state.running
    if leader is not None and leader.publishing:
        if leader.mode == "polling":
            return Fact("delivery", "the relay (polling mode: the only path)", OK)
        return Fact("delivery", "the relay: it took over from CDC", WARN)
    if connector_runs:
        if leader is None and relays:
            return Fact("delivery", "CDC (no relay leads: nothing would take over)", WARN)
        return Fact("delivery", "CDC (Debezium)", OK)
    if leader is not None and leader.mode == "auto":
        return Fact(
            "delivery",
            "none yet: the connector does not run; the relay takes over once rows wait longer "
            "than its grace period",
            WARN,
        )
    return Fact("delivery", "none: the connector does not run and no relay publishes", DOWN)


# -- the broker ---------------------------------------------------------------------------------


def broker_panel(pipeline: Pipeline) -> Panel:
    from kafka import KafkaAdminClient

    from outbox.core.contract import TOPIC_PREFIX
    from outbox.kafka_clients import kafka_errors, open_client
    from outbox.kafka_options import client_options

    kafka = pipeline.kafka
    milliseconds = max(1000, int(pipeline.console.answer_seconds * 1000))
    admin = open_client(
        kafka,
        KafkaAdminClient,
        {
            **client_options(kafka, client_id="outbox-console"),
            "request_timeout_ms": milliseconds,
            "bootstrap_timeout_ms": milliseconds,
        },
    )
    try:
        with kafka_errors(kafka):
            cluster = admin.describe_cluster()
            topics = [name for name in admin.list_topics() if name.startswith(TOPIC_PREFIX)]
    finally:
        admin.close()
    brokers = cluster.get("brokers") or []
    facts = [
        Fact("bootstrap servers", str(kafka.bootstrap_servers)),
        Fact("cluster id", str(cluster.get("cluster_id"))),
        Fact(
            "brokers",
            ", ".join(f"{b.get('broker_id')} at {b.get('host')}:{b.get('port')}" for b in brokers)
            or "none registered",
            OK if brokers else DOWN,
        ),
        Fact("controller", str(cluster.get("controller_id"))),
        Fact("outbox topics", f"{len(topics)} ({TOPIC_PREFIX}*)"),
    ]
    summary = f"{len(brokers)} broker(s), {len(topics)} outbox topic(s)"
    return Panel("Broker", OK if brokers else DOWN, summary, facts)


# -- the lake -----------------------------------------------------------------------------------


def lake_panel(pipeline: Pipeline) -> Panel:
    from outbox_lake.query import freshness

    found = freshness(pipeline.lake, pipeline.kafka)
    facts = [
        Fact("root", pipeline.lake.root),
        Fact("last commit", ago(found.last_commit)),
        Fact("newest event", ago(found.newest_event)),
    ]
    if found.behind is None:
        facts.append(Fact("behind Kafka", f"unknown ({found.unknown_reason})", WARN))
        state, summary = WARN, f"lag unknown: {found.unknown_reason}"
    elif found.behind == 0:
        facts.append(Fact("behind Kafka", "up to date", OK))
        state, summary = OK, f"up to date with Kafka; last commit {ago(found.last_commit)}"
    else:
        behind = f"{found.behind:,} records in {found.partitions_behind} partition(s)"
        facts.append(Fact("behind Kafka", behind, WARN))
        state, summary = WARN, f"behind Kafka by {behind}; last commit {ago(found.last_commit)}"
    url = pipeline.console.lake_metrics_url
    if url is None:
        facts.append(Fact("the job", "metrics not read (OUTBOX_CONSOLE_LAKE_METRICS_URL unset)"))
        return Panel("Lake", state, summary, facts, detail=found)
    from outbox_relay.probe import scrape

    try:
        samples = scrape(url, timeout_seconds=pipeline.console.answer_seconds)
    except OSError as error:
        facts.append(Fact("the job", f"no answer at {url}/metrics ({error})", DOWN))
        return Panel("Lake", DOWN, f"the ingest job does not answer at {url}", facts)
    last_batch = _value(samples, "outbox_lake_last_batch_timestamp_seconds")
    batches = _value(samples, "outbox_lake_batches_total") or 0
    facts.append(Fact("last batch", f"{ago(last_batch or None)} ({batches:,.0f} since start)"))
    for sample in samples:
        if sample.name == "outbox_lake_consumer_lag":
            where = f"lag {sample.labels.get('topic')}[{sample.labels.get('partition')}]"
            facts.append(Fact(where, f"{sample.value:,.0f} records", WARN if sample.value else ""))
    return Panel("Lake", state, summary, facts, detail=found)


# -- reconcile ----------------------------------------------------------------------------------


def reconcile_panel(pipeline: Pipeline) -> Panel:
    from prometheus_client.parser import text_string_to_metric_families

    path = pipeline.console.reconcile_metrics_file
    if path is None:
        return Panel(
            "Reconcile",
            WARN,
            "not set up: run `outbox reconcile --metrics-file FILE` on a schedule and set "
            "OUTBOX_CONSOLE_RECONCILE_METRICS_FILE=FILE",
        )
    text = _read(Path(path))
    if text is None:
        return Panel("Reconcile", WARN, f"no run yet: {path} does not exist")
    samples = [
        sample for family in text_string_to_metric_families(text) for sample in family.samples
    ]
    last_run = next(
        (s.value for s in samples if s.name == "outbox_reconcile_last_run_timestamp_seconds"), None
    )
    findings = [
        (s.labels.get("kind", "?"), s.labels.get("aggregate_type", ""), s.value)
        for s in samples
        if s.name == "outbox_reconcile_findings" and s.value
    ]
    pending = next(
        (s.value for s in samples if s.name == "outbox_reconcile_lake_pending_events"), 0.0
    )
    facts = [Fact("last run", ago(last_run))]
    facts += [
        Fact(f"{kind} [{aggregate or 'all'}]", f"{count:,.0f}", DOWN)
        for kind, aggregate, count in findings
    ]
    if pending:
        facts.append(Fact("not in the lake yet", f"{pending:,.0f} events (not judged)"))
    if findings:
        total = sum(count for _, _, count in findings)
        return Panel("Reconcile", DOWN, f"{total:,.0f} finding(s) in the last run", facts)
    return Panel("Reconcile", OK, f"no findings in the last run ({ago(last_run)})", facts)


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except FileNotFoundError:
        return None


READERS: dict[str, Callable[[Pipeline], Panel]] = {
    "PostgreSQL": postgres_panel,
    "Kafka Connect": connect_panel,
    "Relay": relay_panel,
    "Broker": broker_panel,
    "Lake": lake_panel,
    "Reconcile": reconcile_panel,
}
"""The overview's panels, in their order on the page."""
