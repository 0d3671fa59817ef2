"""One chaos run, start to end: stack, writers, faults, drain, checks, report.

The run passes when every check finds nothing, ``outbox reconcile`` finds nothing, every
fault kind was injected and recovered as often as asked, no component stopped outside a
fault (a halt, :mod:`chaos.watchdog`), and no writer met an error that no fault explains.
Whatever happens, everything the run started is stopped at the end; a failing run keeps the
stack's folder (logs, the lake, the ground truth) for a look.
"""

from __future__ import annotations

import json
import shutil
import threading
import time
from collections.abc import Sequence
from typing import Any

from rich.console import Console

from chaos.faults import FaultInjector, Injected
from chaos.report import (
    as_json,
    checks_table,
    faults_table,
    figures_table,
    halts_report,
    overlapping,
)
from chaos.schedule import plan_faults
from chaos.services import OUTBOX_COMMAND, ChaosServices
from chaos.settings import ChaosSettings
from chaos.truth import GroundTruth
from chaos.verify import check, drain, kafka_copies, lake_rows, run_reconcile
from chaos.watchdog import Clock, Halt, Watchdog
from chaos.writers import FLAVOURS, PATTERNS, Assassin, Writer

__all__ = ["problems", "run"]

_EVENTS_PER_TRANSACTION = 2.8  # the plans' mean (orders 3, accounts about 2.7)
_PROGRESS_EVERY_SECONDS = 30.0
_FAULTS_OVERRUN_SECONDS = 600.0


def _writers(
    settings: ChaosSettings,
    services: ChaosServices,
    truth: GroundTruth,
    assassin: Assassin,
    stop: threading.Event,
) -> list[Writer]:
    count = len(FLAVOURS) * len(PATTERNS)
    rate = settings.events_per_second / count / _EVENTS_PER_TRANSACTION
    writers = []
    for pattern in PATTERNS:
        for flavour in FLAVOURS:
            proxy, conninfo, url = services.proxied()
            writers.append(
                Writer(
                    flavour,
                    pattern,
                    conninfo=conninfo,
                    url=url,
                    truth=truth,
                    assassin=assassin,
                    proxy=proxy,
                    seed=settings.seed,
                    transactions_per_second=rate,
                    stop=stop,
                )
            )
    return writers


def run(settings: ChaosSettings, console: Console) -> bool:
    """The run; True when it passed. Tables on ``console``."""
    console.print(
        f"[bold]chaos run, seed {settings.seed}[/bold] (replay: make chaos ARGS='--seed "
        f"{settings.seed}{' --short' if settings.short else ''}'): "
        f"{settings.duration_seconds:g} s of load at {settings.events_per_second:g} events/s, "
        f"each fault kind {settings.faults_per_kind}x; stack in {settings.stack_dir}"
    )
    services = ChaosServices(settings)
    truth = GroundTruth()
    stop_writers, stop_faults = threading.Event(), threading.Event()
    assassin: Assassin | None = None
    watchdog: Watchdog | None = None
    passed = False
    try:
        started = time.monotonic()
        services.start()
        console.log(
            f"stack, connector, 2 relays and the lake job up in {time.monotonic() - started:.0f} s"
        )
        assassin = Assassin(services.conninfo)
        plan = plan_faults(
            settings.seed, load_seconds=settings.duration_seconds, per_kind=settings.faults_per_kind
        )
        clock = Clock()
        writers = _writers(settings, services, truth, assassin, stop_writers)
        for writer in writers:
            writer.start()
        injector = FaultInjector(services, plan, clock, stop_faults)
        watchdog = Watchdog(services.components(), services.locks, clock, stop_faults)
        injector.start()
        watchdog.start()
        _load(settings, clock, injector, watchdog, truth, console)
        stop_writers.set()
        for writer in writers:
            writer.join(timeout=60)
        load_seconds = clock.now()
        console.log(f"writers stopped at t+{load_seconds:g}s; draining")
        drained = drain(
            services.undelivered,
            truth,
            services.lake_settings,
            services.bootstrap_servers,
            settings.drain_timeout_seconds,
        )
        stop_faults.set()
        watchdog.join(timeout=120)
        outcome = "done" if drained.caught_up else f"NOT done: waiting for {drained.waiting_for}"
        console.log(f"drain {outcome} in {drained.seconds:g} s; checking")
        steps = ", ".join(f"{step} at {at:g} s" for step, at in drained.steps.items())
        console.log(f"drain: {steps}")
        kafka = drained.kafka or kafka_copies(
            services.bootstrap_servers, services.lake_settings.topic_pattern
        )
        checks = check(truth, lake_rows(services.lake_settings), kafka.copies, kafka.undecodable)
        reconciled = run_reconcile(OUTBOX_COMMAND, services.reconcile_environment())
        pairs = overlapping(injector.injected)
        figures = _figures(
            settings, truth, load_seconds, drained.seconds, len(pairs), checks.figures
        )
        figures["commits raced with a kill (backend terminated / connection dropped)"] = (
            f"{sum(w.kills['terminate'] for w in writers):,} / "
            f"{sum(w.kills['drop'] for w in writers):,}"
        )
        figures["writer errors"] = sum(1 for w in writers if w.error is not None)
        figures["halts (found stopped outside any fault)"] = len(watchdog.halts)
        console.print(faults_table(injector.injected, settings.least_per_kind))
        console.print(figures_table(figures))
        if watchdog.halts:
            console.print(halts_report(watchdog.halts))
        console.print(checks_table(checks, reconciled))
        for note in sorted(set(watchdog.errors)):
            console.print(f"[yellow]watchdog: {note}[/yellow]")
        found = problems(
            injector.injected,
            settings.least_per_kind,
            writers,
            caught_up=drained.caught_up,
            halts=watchdog.halts,
        )
        for problem in found:
            console.print(f"[red]{problem}[/red]")
        passed = checks.clean and reconciled.clean and not found
        report = as_json(injector.injected, watchdog.halts, figures, checks, reconciled)
        (settings.run_dir / "report.json").write_text(json.dumps(report, indent=2, default=str))
        truth.save(settings.run_dir / "truth.jsonl")
        verdict = "[green]PASSED[/green]" if passed else "[red]FAILED[/red]"
        console.print(
            f"{verdict} seed {settings.seed}; report in {settings.run_dir / 'report.json'}"
        )
        return passed
    finally:
        stop_writers.set()
        stop_faults.set()
        if watchdog is not None:
            watchdog.join(timeout=60)  # so that it starts nothing while the stack stops
        if assassin is not None:
            assassin.close()
        services.stop()
        if passed and not settings.keep:
            services.destroy()
            shutil.rmtree(settings.run_dir / "lake", ignore_errors=True)


def _load(
    settings: ChaosSettings,
    clock: Clock,
    injector: FaultInjector,
    watchdog: Watchdog,
    truth: GroundTruth,
    console: Console,
) -> None:
    """The load phase: the duration, and on until every fault was brought back."""
    next_progress = _PROGRESS_EVERY_SECONDS
    reported: set[int] = set()
    halts = 0
    deadline = settings.duration_seconds + _FAULTS_OVERRUN_SECONDS
    while clock.now() < deadline:
        for halt in watchdog.halts[halts:]:
            halts += 1
            last = halt.log[-1] if halt.log else "(empty log)"
            console.log(f"[red]HALT: {halt.problem}[/red]; its log ends: {last}")
        for number, fault in enumerate(injector.injected):
            if fault.recovered is not None and number not in reported:
                reported.add(number)
                console.log(
                    f"t+{fault.started:g}s {fault.planned.kind} -> t+{fault.recovered:g}s: "
                    + (f"[red]{fault.error}[/red]" if fault.error else fault.detail)
                )
        if clock.now() >= next_progress:
            next_progress += _PROGRESS_EVERY_SECONDS
            console.log(f"t+{clock.now():g}s: {truth.committed_count():,} events committed")
        if clock.now() >= settings.duration_seconds and injector.join(timeout=0):
            return
        time.sleep(0.5)


def _figures(
    settings: ChaosSettings,
    truth: GroundTruth,
    load_seconds: float,
    drain_seconds: float,
    overlaps: int,
    check_figures: dict[str, int],
) -> dict[str, Any]:
    committed = truth.committed_count()
    return {
        "seed": settings.seed,
        "load seconds": load_seconds,
        "events committed": committed,
        "events rolled back (on purpose)": len(truth.rolled_back),
        "events aborted (failed before COMMIT)": len(truth.aborted),
        "events of unknown outcome": len(truth.unknown),
        "  of which in the lake": check_figures.get("unknown_landed", 0),
        "  of which nowhere": check_figures.get("unknown_absent", 0),
        "transactions committed / rolled back / aborted / unknown": " / ".join(
            f"{truth.transactions[o]:,}" for o in ("committed", "rolled_back", "aborted", "unknown")
        ),
        "throughput (committed events/s)": round(committed / load_seconds, 1)
        if load_seconds
        else 0,
        "drain seconds": drain_seconds,
        "overlapping fault pairs": overlaps,
        "lake rows": check_figures.get("lake_rows", 0),
        "Kafka records (copies)": check_figures.get("kafka_records", 0),
        "Kafka duplicate copies (allowed)": check_figures.get("kafka_duplicate_copies", 0),
    }


def problems(
    injected: list[Injected],
    least_per_kind: int,
    writers: Sequence[Writer],
    *,
    caught_up: bool,
    halts: Sequence[Halt],
) -> list[str]:
    """What fails the run besides the checks: a fault kind injected and recovered fewer times
    than asked, a writer's error, a writer that did not stop, a drain past its deadline, and
    every halt (a component that stopped outside any fault)."""
    found = _short_kinds(injected, least_per_kind)
    found += [f"writer {w.name}: {type(w.error).__name__}: {w.error}" for w in writers if w.error]
    found += [f"writer {w.name} did not stop" for w in writers if w.is_alive()]
    if not caught_up:
        found.append("the drain did not finish within its deadline")
    found += [halt.problem for halt in halts]
    return found


def _short_kinds(injected: list[Injected], least: int) -> list[str]:
    counts: dict[str, int] = {}
    for fault in injected:
        counts.setdefault(str(fault.planned.kind), 0)
        if fault.done:
            counts[str(fault.planned.kind)] += 1
    return [
        f"fault '{kind}' injected and recovered {count} times, fewer than {least}"
        for kind, count in counts.items()
        if count < least
    ]
