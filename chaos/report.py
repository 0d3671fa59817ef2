"""The run's tables (rich): faults injected, figures, halts (with their logs), checks; and the
same as JSON."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from rich.console import Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from chaos.faults import Injected
from chaos.schedule import Kind
from chaos.verify import Checks, ReconcileRun
from chaos.watchdog import Halt

__all__ = [
    "as_json",
    "checks_table",
    "faults_table",
    "figures_table",
    "halts_report",
    "overlapping",
]


def overlapping(injected: list[Injected]) -> list[tuple[Injected, Injected]]:
    """Pairs of faults that were in effect at the same time."""
    spans = [f for f in injected if f.started is not None and f.recovered is not None]
    return [
        (first, second)
        for n, first in enumerate(spans)
        for second in spans[n + 1 :]
        if first.started < second.recovered and second.started < first.recovered  # type: ignore[operator]
    ]


def faults_table(injected: list[Injected], least: int) -> Table:
    table = Table(title="Faults injected (t: seconds after the load started)")
    table.add_column("fault")
    table.add_column("count", justify="right")
    table.add_column("at t+ (held, recovered after)")
    table.add_column("ok")
    by_kind: dict[Kind, list[Injected]] = defaultdict(list)
    for fault in injected:
        by_kind[fault.planned.kind].append(fault)
    for kind in Kind:
        faults = by_kind.get(kind, [])
        done = [f for f in faults if f.done]
        times = ", ".join(
            f"{f.started:g}s ({f.planned.hold:g}s, {(f.recovered or 0) - (f.started or 0):.0f}s)"
            if f.started is not None
            else "not started"
            for f in faults
        )
        errors = "; ".join(f.error[:160] for f in faults if f.error)
        ok = len(done) >= least
        table.add_row(
            str(kind),
            str(len(done)),
            times,
            ("yes" if ok else "NO") + (f": {errors}" if errors else ""),
        )
    return table


def figures_table(figures: dict[str, Any]) -> Table:
    table = Table(title="Figures")
    table.add_column("figure")
    table.add_column("value", justify="right")
    for name, value in figures.items():
        table.add_row(name, f"{value:,}" if isinstance(value, int) else str(value))
    return table


def checks_table(checks: Checks, reconcile: ReconcileRun) -> Table:
    table = Table(title="Checks (each must be 0)")
    table.add_column("check")
    table.add_column("found", justify="right")
    table.add_column("examples")
    for name, count in checks.counts.items():
        table.add_row(name, str(count), "\n".join(checks.examples.get(name, [])))
    findings = (
        ", ".join(
            f"{kind}: {count}"
            for by_type in (reconcile.report or {}).get("by_aggregate_type", {}).values()
            for kind, count in by_type.items()
        )
        if reconcile.report
        else reconcile.stderr[-300:]
    )
    table.add_row(
        f"outbox reconcile --json (exit {reconcile.exit_code})",
        str(reconcile.findings if reconcile.report else "no report"),
        findings,
    )
    return table


def halts_report(halts: list[Halt]) -> Group:
    """Each halt (a component that stopped outside any fault: the run fails), then its log's
    last lines as the watchdog found them."""
    table = Table(title="Halts: found stopped outside any fault (each fails the run)")
    table.add_column("t+")
    table.add_column("component")
    table.add_column("what")
    table.add_column("then")
    table.add_column("log", overflow="fold")
    for halt in halts:
        table.add_row(f"{halt.at:g}s", halt.component, halt.what, halt.restart, halt.log_file)
    logs = [
        Panel(
            Text("\n".join(halt.log) or "(empty log)"),
            title=f"{halt.component} at t+{halt.at:g}s: the last {len(halt.log)} lines of its log",
            title_align="left",
            border_style="red",
        )
        for halt in halts
    ]
    return Group(table, *logs)


def as_json(
    injected: list[Injected],
    halts: list[Halt],
    figures: dict[str, Any],
    checks: Checks,
    reconcile: ReconcileRun,
) -> dict[str, Any]:
    return {
        "faults": [
            {
                "kind": str(f.planned.kind),
                "planned_at": f.planned.at,
                "hold": f.planned.hold,
                "started": f.started,
                "recovered": f.recovered,
                "detail": f.detail,
                "error": f.error,
            }
            for f in injected
        ],
        "halts": [
            {
                "at": halt.at,
                "component": halt.component,
                "what": halt.what,
                "then": halt.restart,
                "log_file": halt.log_file,
                "log": list(halt.log),
            }
            for halt in halts
        ],
        "figures": figures,
        "checks": checks.counts,
        "examples": checks.examples,
        "check_figures": checks.figures,
        "reconcile": {"exit_code": reconcile.exit_code, "report": reconcile.report},
    }
