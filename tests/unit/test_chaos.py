"""The chaos suite's own decisions, without services: its schedule covers every fault kind as
often as asked and replays from its seed, its checks find each kind of violation (a checker
that cannot fail would pass every run), and a component that stops outside a fault fails the
run with its last log lines (a watchdog that only restarts it would hide a halt)."""

from __future__ import annotations

import json
import sys
import threading
import uuid
from collections import Counter
from itertools import pairwise
from pathlib import Path

from rich.console import Console

from chaos.faults import Injected
from chaos.report import as_json, halts_report
from chaos.run import problems
from chaos.schedule import RESOURCE, Kind, PlannedFault, plan_faults
from chaos.services import service_stopped
from chaos.truth import GroundTruth, Outcome, Written
from chaos.verify import Checks, LakeRow, ReconcileRun, check
from chaos.watchdog import LOG_LINES, Clock, Component, Watchdog, log_tail
from outbox_reconcile.records import KafkaCopy
from outbox_stack.process import ServiceProcess
from tests.fix_relay import wait_until


def test_the_schedule_has_every_kind_as_often_as_asked_some_together_and_replays() -> None:
    plan = plan_faults(11, load_seconds=420, per_kind=2)
    assert Counter(fault.kind for fault in plan) == dict.fromkeys(Kind, 2)
    assert all(0.08 * 420 <= fault.at <= 0.8 * 420 + 3 for fault in plan)
    assert [fault.at for fault in plan] == sorted(fault.at for fault in plan)
    together = [
        (first, second)
        for first, second in pairwise(plan)
        if second.at - first.at <= 3 and RESOURCE[first.kind] != RESOURCE[second.kind]
    ]
    assert together, "no two faults planned at the same time"
    assert plan_faults(11, load_seconds=420, per_kind=2) == plan
    assert plan_faults(12, load_seconds=420, per_kind=2) != plan
    short = plan_faults(11, load_seconds=100, per_kind=1)
    assert Counter(fault.kind for fault in short) == dict.fromkeys(Kind, 1)


def test_the_broker_is_killed_as_well_as_paused_in_every_profile() -> None:
    for per_kind in (1, 2):
        kinds = Counter(f.kind for f in plan_faults(5, load_seconds=100, per_kind=per_kind))
        assert kinds[Kind.BROKER_KILL] == kinds[Kind.BROKER_PAUSE] == per_kind
    assert RESOURCE[Kind.BROKER_KILL] == RESOURCE[Kind.BROKER_PAUSE] == "broker"


class Pipeline:
    """A ground truth and what Kafka and the lake hold, written event by event."""

    def __init__(self) -> None:
        self.truth = GroundTruth()
        self.lake: list[LakeRow] = []
        self.kafka: list[KafkaCopy] = []
        self.positions = 0

    def written(self, aggregate_id: str = "a1", version: int | None = None) -> Written:
        self.positions += 1
        return Written(str(uuid.uuid4()), "account", aggregate_id, self.positions, version)

    def on_kafka(self, event: Written, position: int | None = None) -> None:
        self.kafka.append(
            KafkaCopy(
                event_id=event.event_id,
                aggregate_type=event.aggregate_type,
                aggregate_id=event.aggregate_id,
                position=event.position if position is None else position,
                topic="outbox.event.account",
                partition=0,
                offset=len(self.kafka),
                timestamp_ms=0,
            )
        )

    def in_lake(self, event: Written, position: int | None = None) -> None:
        copy = next(c for c in self.kafka if c.event_id == event.event_id)
        self.lake.append(
            LakeRow(
                event_id=event.event_id,
                aggregate_type=event.aggregate_type,
                aggregate_id=event.aggregate_id,
                position=copy.position if position is None else position,
                partition=copy.partition,
                offset=copy.offset,
            )
        )

    def delivered(
        self, outcome: Outcome = Outcome.COMMITTED, version: int | None = None
    ) -> Written:
        event = self.written(version=version)
        self.truth.record("writer", outcome, [event])
        self.on_kafka(event)
        self.in_lake(event)
        return event

    def counts(self) -> dict[str, int]:
        found = check(self.truth, self.lake, self.kafka)
        return {name: count for name, count in found.counts.items() if count}


def test_a_clean_pipeline_passes_with_duplicate_copies_on_kafka_and_unknown_outcomes() -> None:
    pipeline = Pipeline()
    first = pipeline.delivered(version=1)
    pipeline.delivered(version=2)
    pipeline.on_kafka(first)  # a relay's copy after a takeover: allowed
    pipeline.delivered(Outcome.UNKNOWN, version=3)  # it did commit
    pipeline.truth.record("writer", Outcome.UNKNOWN, [pipeline.written()])  # it did not
    pipeline.truth.record("writer", Outcome.ROLLED_BACK, [pipeline.written()])
    found = check(pipeline.truth, pipeline.lake, pipeline.kafka)
    assert found.clean, found.counts
    assert found.figures["unknown_landed"] == found.figures["unknown_absent"] == 1
    assert found.figures["kafka_duplicate_copies"] == 1


def test_the_checks_find_a_lost_event_and_an_unknown_one_seen_on_kafka_only() -> None:
    pipeline = Pipeline()
    lost = pipeline.written()
    pipeline.truth.record("writer", Outcome.COMMITTED, [lost])
    unknown = pipeline.written()
    pipeline.truth.record("writer", Outcome.UNKNOWN, [unknown])
    pipeline.on_kafka(unknown)  # so it committed, and must be in the lake
    assert pipeline.counts() == {"lost (committed, not in the lake)": 2}


def test_the_checks_find_a_duplicate_a_phantom_and_an_id_nobody_wrote() -> None:
    pipeline = Pipeline()
    twice = pipeline.delivered()
    pipeline.in_lake(twice)
    pipeline.delivered(Outcome.ROLLED_BACK)
    aborted = pipeline.written()
    pipeline.truth.record("writer", Outcome.ABORTED, [aborted])
    pipeline.on_kafka(aborted)
    pipeline.on_kafka(pipeline.written())  # in no writer's ground truth
    assert pipeline.counts() == {
        "duplicated in the lake": 1,
        "phantom (rolled back or aborted, yet seen)": 2,
        "never written, yet seen": 1,
    }


def test_the_checks_find_order_violations_and_a_position_not_the_commits() -> None:
    pipeline = Pipeline()
    early, late = pipeline.written(), pipeline.written()
    pipeline.truth.record("writer", Outcome.COMMITTED, [early, late])
    pipeline.on_kafka(late)
    pipeline.on_kafka(early)  # the later commit first: on Kafka and so in the lake
    pipeline.in_lake(late)
    pipeline.in_lake(early)
    other = pipeline.written()
    pipeline.truth.record("writer", Outcome.COMMITTED, [other])
    pipeline.on_kafka(other)
    pipeline.in_lake(other, position=999)  # not the position its transaction read back
    assert pipeline.counts() == {
        "order violations in the lake": 1,
        "order violations on Kafka": 1,
        "lake position differs from the commit's": 1,
    }


def test_the_ground_truth_itself_is_checked_versions_rise_with_positions() -> None:
    pipeline = Pipeline()
    pipeline.delivered(version=2)
    pipeline.delivered(version=1)  # committed later, yet an older version of the row
    assert pipeline.counts() == {"ground truth: versions out of position order": 1}


class FakeProcess:
    """A component's process: it runs until it ``exit``s; ``start`` runs it again."""

    def __init__(self, log: Path) -> None:
        self.log = log
        self.code: int | None = None
        self.starts = 0
        self.refuse_start = False

    def exit(self, code: int, last_words: str) -> None:
        with self.log.open("a") as log:
            log.write(f"ERROR {last_words}\n")
        self.code = code

    def stopped(self) -> str | None:
        return None if self.code is None else f"exited with status {self.code}"

    def start(self) -> str:
        if self.refuse_start:
            raise RuntimeError("the lake job exited at start")
        self.starts += 1
        self.code = None
        return "started again"

    def component(self, name: str, *resources: str) -> Component:
        return Component(name, resources, self.stopped, self.log, self.start)


def watched(
    tmp_path: Path, *resources: str
) -> tuple[FakeProcess, Watchdog, dict[str, threading.Lock]]:
    log = tmp_path / "lake-ingest.log"
    log.write_text("".join(f"INFO batch {n} committed\n" for n in range(100)))
    process = FakeProcess(log)
    locks = {name: threading.Lock() for name in ("lake", "postgres", "broker", "connect")}
    watchdog = Watchdog(
        [process.component("lake job", *resources)], locks, Clock(), threading.Event()
    )
    return process, watchdog, locks


def test_a_component_that_stops_outside_a_fault_fails_the_run_with_its_last_log_lines(
    tmp_path: Path,
) -> None:
    process, watchdog, _ = watched(tmp_path, "lake")
    watchdog.check()
    assert watchdog.halts == []
    process.exit(1, "StreamingQueryException: Failed to fetch offsets")
    watchdog.check()
    assert len(watchdog.halts) == 1
    halt = watchdog.halts[0]
    assert (halt.component, halt.what) == ("lake job", "exited with status 1")
    assert len(halt.log) == LOG_LINES
    assert halt.log[-1] == "ERROR StreamingQueryException: Failed to fetch offsets"
    assert halt.log[0] == f"INFO batch {101 - LOG_LINES} committed"
    # Started again, so the run goes on to its checks; but the run fails.
    assert process.starts == 1
    watchdog.check()
    assert len(watchdog.halts) == 1, "one halt, recorded once"
    found = problems([], 1, [], caught_up=True, halts=watchdog.halts)
    assert found == [
        f"lake job found stopped outside any fault at t+{halt.at:g}s: exited with status 1 "
        f"(log: {tmp_path / 'lake-ingest.log'})"
    ]
    console = Console(record=True, width=200)
    console.print(halts_report(watchdog.halts))
    shown = console.export_text()
    assert "Failed to fetch offsets" in shown and f"INFO batch {100 - LOG_LINES} " not in shown
    report = json.loads(json.dumps(as_json([], watchdog.halts, {}, _no_checks(), _no_reconcile())))
    assert report["halts"][0]["log"] == list(halt.log)
    assert report["halts"][0]["then"] == "started again"


def test_a_run_without_halts_has_nothing_to_fail_it() -> None:
    fault = Injected(PlannedFault(1.0, Kind.BROKER_KILL, 2.0, 1), started=1.0, recovered=9.0)
    assert problems([fault], 1, [], caught_up=True, halts=[]) == []
    fault.error = "StackError: the broker did not answer"
    assert problems([fault], 1, [], caught_up=True, halts=[]) == [
        "fault 'kill -9 broker' injected and recovered 0 times, fewer than 1"
    ]


def test_a_stop_while_a_fault_acts_on_the_component_is_planned(tmp_path: Path) -> None:
    """The connector is looked at only when no fault acts on Connect, PostgreSQL or the
    broker: each fails its task until the fault brings it back."""
    process, watchdog, locks = watched(tmp_path, "connect", "postgres", "broker")
    for resource in ("connect", "postgres", "broker"):
        with locks[resource]:  # the fault's kill and its recovery
            process.exit(137, "killed by the fault")
            watchdog.check()
            assert watchdog.halts == []
            process.start()  # brought back by the fault
    watchdog.check()
    assert watchdog.halts == [] and not any(lock.locked() for lock in locks.values())


def test_a_component_that_cannot_be_started_again_is_one_halt(tmp_path: Path) -> None:
    process, watchdog, _ = watched(tmp_path, "lake")
    process.refuse_start = True
    process.exit(1, "Py4JError")
    for _ in range(3):
        watchdog.check()
    assert len(watchdog.halts) == 1
    assert watchdog.halts[0].restart == (
        "could not start it again: RuntimeError: the lake job exited at start"
    )


def test_the_end_of_the_run_records_a_halt_without_starting_anything(tmp_path: Path) -> None:
    process, watchdog, _ = watched(tmp_path, "lake")
    process.exit(1, "gone during the drain")
    watchdog.check(restart=False)
    assert process.starts == 0
    assert watchdog.halts[0].restart == "left stopped (the run is ending)"


def test_a_real_process_that_exits_is_told_with_its_status_and_last_lines(tmp_path: Path) -> None:
    """What the watchdog sees of a stack service (the lake job, Connect, the broker)."""
    process = ServiceProcess("lake-ingest", tmp_path, marker="halting-job")
    script = "import sys; print('\\n'.join(f'line {n}' for n in range(40))); sys.exit(3)"
    pid = process.start([sys.executable, "-c", script, "halting-job"])
    wait_until(lambda: not process.is_running(), timeout=30, what="the process gone")
    assert service_stopped(process) == f"pid {pid} exited with status 3"
    assert log_tail(process.log_file) == tuple(f"line {n}" for n in range(10, 40))


def _no_checks() -> Checks:
    return check(GroundTruth(), [], [])


def _no_reconcile() -> ReconcileRun:
    return ReconcileRun(0, {"finding_count": 0}, "")
