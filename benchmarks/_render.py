"""Render the benchmark page and its plots from the JSON results (no measuring here).

Plots (matplotlib, PNG): events/s of each stage against its baseline, commit-to-queryable
latency by offered rate, the SDK's transactions per second by way of writing, and lake batch
time against table size. A figure whose benchmark did not run is left out, and the page says
which results it lacks. The headline figures (CDC on Apache Kafka, the broker's and
Connect's memory, the whole pipeline against its targets) come first, side by side.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

__all__ = ["render"]


def _fmt(value: Any, digits: int = 0) -> str:
    if value is None:
        return "-"
    if isinstance(value, float | int):
        return f"{value:,.{digits}f}"
    return str(value)


# The benchmarks that run on a broker: each result names the stack it ran on.
ON_BROKER = ("cdc_throughput", "relay_throughput", "lake_ingest", "pipeline")


def _stack(data: dict[str, Any]) -> str | None:
    """The broker (and Connect) a result ran on, as the benchmark recorded it."""
    found = data.get("stack") or data.get("figures", {}).get("broker")
    return None if found is None else str(found)


def _machine(results: dict[str, Any]) -> str:
    lines = [
        "| benchmark | started (UTC) | cores | memory | load average before -> after | took "
        "| stack |"
    ]
    lines.append("| --- | --- | --- | --- | --- | --- | --- |")
    for name, data in sorted(results.items(), key=lambda item: item[1].get("started_at", "")):
        before, after = data.get("machine_before", {}), data.get("machine_after", {})
        load = f"{before.get('load_average', ['?'])[0]} -> {after.get('load_average', ['?'])[0]}"
        stack = _stack(data) or ("not recorded" if name in ON_BROKER else "-")
        lines.append(
            f"| {name} | {data.get('started_at', '?')} | {before.get('cores')} | "
            f"{before.get('memory_gib')} GiB | {load} | {data.get('seconds', '?')} s | {stack} |"
        )
    if any(name in ON_BROKER and _stack(data) is None for name, data in results.items()):
        lines += [
            "",
            "A result whose stack is not recorded ran before the local stack moved to Apache "
            "Kafka (its broker was then Tansu): `make bench` measures it anew.",
        ]
    return "\n".join(lines)


def _latency_by_rate(figures: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Commit-to-broker figures by offered rate (events/s); results from before the runs at
    several rates held one rate, 1,000 events/s."""
    if "commit_to_broker_seconds" in figures:
        return dict(figures["commit_to_broker_seconds"])
    if "commit_to_broker_seconds_at_1000" in figures:
        return {"1000": figures["commit_to_broker_seconds_at_1000"]}
    return {}


def _latency_table(by_rate: dict[str, dict[str, Any]]) -> list[str]:
    rates = sorted(by_rate, key=int)
    lines = [
        "| commit-to-broker | " + " | ".join(f"{int(rate):,} events/s" for rate in rates) + " |",
        "| --- |" + " ---: |" * len(rates),
    ]
    if all("written_per_second" in by_rate[rate] for rate in rates):
        lines.append(
            "| written (events/s) | "
            + " | ".join(_fmt(by_rate[rate]["written_per_second"]) for rate in rates)
            + " |"
        )
    for name in ("p50", "p95", "p99"):
        lines.append(
            f"| {name} (ms) | "
            + " | ".join(_fmt(by_rate[rate][name] * 1000) for rate in rates)
            + " |"
        )
    return lines


def _memory_table(resident: dict[str, dict[str, float]]) -> list[str]:
    names = [name for name in ("broker", "connect") if name in resident]
    titles = {"broker": "broker", "connect": "Connect"}
    return [
        "| resident memory (RSS, MiB) | " + " | ".join(titles[name] for name in names) + " |",
        "| --- |" + " ---: |" * len(names),
        "| idle, before the load | "
        + " | ".join(_fmt(resident[name]["idle"]) for name in names)
        + " |",
        "| peak, during the run | "
        + " | ".join(_fmt(resident[name]["peak"]) for name in names)
        + " |",
    ]


def _pipeline_targets(runs: list[dict[str, Any]]) -> list[str]:
    """Issue 20's targets for the whole pipeline on the default stack, met or not."""
    by_rate = {run["rate"]: run for run in runs}

    def verdict(met: bool | None) -> str:
        return "not run" if met is None else "met" if met else "**missed**"

    lines = ["| whole pipeline | target | measured | |", "| --- | --- | ---: | --- |"]
    kept = by_rate.get(10000)
    lines.append(
        "| keeps up at 10,000 events/s | yes | "
        + ("-" if kept is None else "yes" if kept["keeps_up"] else "no")
        + f" | {verdict(None if kept is None else bool(kept['keeps_up']))} |"
    )
    for rate, limit in ((1000, 2.0), (5000, 3.0)):
        run = by_rate.get(rate)
        p95 = None if run is None else run["commit_to_queryable_seconds"]["p95"]
        lines.append(
            f"| commit-to-queryable p95 at {rate:,} events/s | < {limit:g} s | "
            f"{'-' if p95 is None else f'{p95:.2f} s'} | "
            f"{verdict(None if p95 is None else p95 < limit)} |"
        )
    return lines


def _headline(results: dict[str, Any]) -> str:
    """The figures issue 20 asks for, side by side: CDC on Apache Kafka (events/s, and
    commit-to-broker at each rate), the broker's and Connect's memory, and the whole
    pipeline against its targets."""
    lines = ["## Headline figures", ""]
    if "cdc_throughput" in results:
        data = results["cdc_throughput"]
        f = data["figures"]
        lines += [
            f"CDC (`benchmarks/cdc_throughput.py`); stack: {_stack(data) or 'not recorded'}.",
            "",
        ]
        if "router_events_per_second" in f:
            lines += [
                "| CDC events/s | with the Event Router | raw change events | ratio |",
                "| --- | ---: | ---: | ---: |",
                f"| {_fmt(f['events'])} events in one transaction | "
                f"{_fmt(f['router_events_per_second'])} | {_fmt(f['raw_events_per_second'])} | "
                f"{f['ratio']:.2f} |",
                "",
            ]
        by_rate = _latency_by_rate(f)
        if by_rate:
            lines += [*_latency_table(by_rate), ""]
        if f.get("resident_memory_mib"):
            lines += [*_memory_table(f["resident_memory_mib"]), ""]
            if f.get("stack_started_by_run") is False:
                lines += [
                    "Idle: the stack was already running when the run started (a JVM keeps "
                    "the memory it grew into); the stack at rest is measured on a stack the "
                    "run starts (`outbox stack down` first).",
                    "",
                ]
    if "pipeline" in results:
        data = results["pipeline"]
        stack = _stack(data) or "not recorded"
        lines += [
            f"The whole pipeline (`benchmarks/pipeline.py`); stack: {stack}.",
            "",
            *_pipeline_targets(data["figures"]["runs"]),
            "",
        ]
    return "\n".join(lines) if len(lines) > 2 else ""


def _sdk(data: dict[str, Any], folder: Path) -> str:
    figures = data["figures"]
    parts = [
        "## Write path: the SDK in a business transaction (`benchmarks/sdk_publish.py`)",
        "",
        f"Every scenario in turn, one transaction each, for {figures['seconds']:g} s; the "
        f"median of the {figures.get('round_seconds', '?')}-second rounds. PostgreSQL with "
        "fsync on. The hand-written peer is an INSERT of the same row into a Debezium-style "
        "outbox table (no trigger), in the same transaction.",
        "",
    ]
    clients = figures["clients"]
    fig, axes = plt.subplots(1, len(clients), figsize=(6 * len(clients), 4.5), squeeze=False)
    for axis, (count, block) in zip(axes[0], clients.items(), strict=True):
        labels = list(block["tx_per_second"])
        axis.barh(labels, [block["tx_per_second"][label] for label in labels], color="#4c72b0")
        axis.invert_yaxis()
        axis.set_title(f"{count} client(s): transactions/s")
        axis.tick_params(axis="y", labelsize=8)
        parts += [f"**{count} client(s)**", "", "| scenario | tx/s |", "| --- | ---: |"]
        parts += [f"| {label} | {_fmt(value)} |" for label, value in block["tx_per_second"].items()]
        parts += ["", "| ratio | value | target |", "| --- | ---: | --- |"]
        for name, ratio in block["ratios"].items():
            target = ratio["target"]
            verdict = (
                ""
                if target is None
                else f">= {target} " + ("met" if ratio["ratio"] >= target else "**missed**")
            )
            parts.append(f"| {name} | {ratio['ratio']:.2f} | {verdict} |")
        parts.append("")
    fig.tight_layout()
    fig.savefig(folder / "sdk_publish.png", dpi=90)
    plt.close(fig)
    parts += ["![SDK transactions per second](benchmarks/sdk_publish.png)", ""]
    return "\n".join(parts)


def _stages(results: dict[str, Any], folder: Path) -> str:
    pairs: list[tuple[str, float, float, str]] = []  # stage, measured, baseline, baseline name
    if (
        "cdc_throughput" in results
        and "router_events_per_second" in results["cdc_throughput"]["figures"]
    ):
        f = results["cdc_throughput"]["figures"]
        pairs.append(
            (
                "CDC (Event Router)",
                f["router_events_per_second"],
                f["raw_events_per_second"],
                "raw change events",
            )
        )
    if "relay_throughput" in results:
        f = results["relay_throughput"]["figures"]
        pairs.append(
            (
                "polling relay",
                f["relay_events_per_second"],
                f["bare_producer_events_per_second"],
                "bare producer",
            )
        )
    if "lake_ingest" in results and "catch_up" in results["lake_ingest"]["figures"]:
        f = results["lake_ingest"]["figures"]["catch_up"]
        pairs.append(("lake catch-up", f["ours"], f["floor"], "Spark's own Delta sink"))
    if not pairs:
        return ""
    fig, axis = plt.subplots(figsize=(8, 4))
    positions = range(len(pairs))
    axis.bar([p - 0.2 for p in positions], [p[1] for p in pairs], 0.4, label="stage")
    axis.bar([p + 0.2 for p in positions], [p[2] for p in pairs], 0.4, label="its baseline")
    axis.set_xticks(list(positions), [f"{p[0]}\nvs {p[3]}" for p in pairs], fontsize=8)
    axis.set_ylabel("events/s")
    axis.legend()
    axis.set_title("Events per second of each stage against its baseline")
    fig.tight_layout()
    fig.savefig(folder / "stages.png", dpi=90)
    plt.close(fig)
    lines = [
        "## Each stage against its baseline",
        "",
        "| stage | events/s | baseline | events/s | ratio |",
        "| --- | ---: | --- | ---: | ---: |",
    ]
    lines += [
        f"| {stage} | {_fmt(measured)} | {name} | {_fmt(base)} | {measured / base:.2f} |"
        for stage, measured, base, name in pairs
    ]
    return "\n".join([*lines, "", "![stages](benchmarks/stages.png)", ""])


def _lake(data: dict[str, Any], folder: Path) -> str:
    """Our job beside Spark's own Delta sink (the floor), in one run."""
    f = data["figures"]
    lines = ["## Lake ingest beside Spark's own sink (`benchmarks/lake_ingest.py`)", ""]
    if "broker" in f:
        lines += [f"Broker: {f['broker']}.", ""]
    fresh = f.get("freshness") or {}
    if fresh:
        lines += [
            "Commit-to-queryable in `events`, steady state (the first third of each run apart), "
            "ours against Spark's own Delta sink with the same session settings (the floor):",
            "",
            "| rate/s | floor p50 / p95 s | floor events/s | ours p50 / p95 s | ours events/s "
            "| p95 ratio (target <= 1.3) | typed tables p95 s |",
            "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        ]
        for rate, runs in sorted(fresh.items(), key=lambda item: int(item[0])):
            floor, ours = _middle(runs["floor"]), _middle(runs["ours"])
            typed = (ours.get("typed") or {}).get("p95")
            lines.append(
                f"| {int(rate):,} | {floor['p50']:.2f} / {floor['p95']:.2f} | "
                f"{_fmt(floor['events_per_second'])} | {ours['p50']:.2f} / {ours['p95']:.2f} | "
                f"{_fmt(ours['events_per_second'])} | {ours['p95'] / floor['p95']:.2f} | "
                f"{'-' if typed is None else f'{typed:.2f}'} |"
            )
        lines.append("")
    catch = f.get("catch_up")
    if catch:
        lines.append(
            f"Catch-up of {_fmt(catch['backlog'])} events already on Kafka: floor "
            f"{_fmt(catch['floor'])} events/s, ours {_fmt(catch['ours'])} events/s into "
            f"`events` (ratio {catch['ratio']:.2f}, target >= 0.8)"
            + (
                f"; {_fmt(catch['ours_with_typed'])} events/s until the typed tables, filled "
                "after `events`, hold them too."
                if "ours_with_typed" in catch
                else "."
            )
        )
    cold = f.get("cold_start")
    if cold:
        lines.append(
            f"\nCold start (`outbox lake ingest --available-now` on 1,000 events, a new JVM): "
            f"{cold['wall_seconds']:.1f} s in all, first batch landed after "
            f"{cold['first_batch_seconds']:.1f} s."
        )
    return "\n".join([*lines, ""])


def _middle(runs: list[dict[str, Any]]) -> dict[str, Any]:
    return sorted(runs, key=lambda run: run.get("p95", 0))[len(runs) // 2]


def _cdc(data: dict[str, Any]) -> str:
    f = data["figures"]
    lines = ["## CDC (`benchmarks/cdc_throughput.py`)", ""]
    if "router_events_per_second" in f:
        lines.append(
            f"{_fmt(f['events'])} events in one transaction: with the Event Router "
            f"{_fmt(f['router_events_per_second'])} events/s, raw change events "
            f"{_fmt(f['raw_events_per_second'])} events/s (ratio {f['ratio']:.2f}, target >= 0.9)."
        )
    for rate, waits in sorted(_latency_by_rate(f).items(), key=lambda item: int(item[0])):
        target = " (target p99 < 1 s)" if int(rate) == 1000 else ""
        lines.append(
            f"Commit-to-broker at {int(rate):,} events/s (read committed): p50 "
            f"{_fmt(waits['p50'] * 1000)} ms, p95 {_fmt(waits['p95'] * 1000)} ms, p99 "
            f"{_fmt(waits['p99'] * 1000)} ms{target}."
        )
    resident = f.get("resident_memory_mib", {})
    if resident:
        lines.append(
            "Resident memory: "
            + "; ".join(
                f"{'Connect' if name == 'connect' else name} {_fmt(found['idle'])} MiB idle, "
                f"{_fmt(found['peak'])} MiB at peak"
                for name, found in resident.items()
            )
            + "."
        )
    return "\n".join([*lines, ""])


def _relay(data: dict[str, Any]) -> str:
    f = data["figures"]
    return (
        "## Polling relay (`benchmarks/relay_throughput.py`)\n\n"
        f"Draining {_fmt(f['events'])} events: relay {_fmt(f['relay_events_per_second'])} "
        f"events/s, bare kafka-python producer {_fmt(f['bare_producer_events_per_second'])} "
        f"events/s on the same records: ratio {f['ratio']:.2f} (target >= {f['target']}). "
        "Both warm (connected, one record sent) when the clock starts. The relay's producer "
        "alone, sending the same rows batch by batch with no database: "
        f"{_fmt(f.get('relay_producer_alone_events_per_second'))} events/s. "
        "With a transaction held open all along: "
        f"{_fmt(f.get('relay_held_open_events_per_second'))} events/s; after it ended: "
        f"{_fmt(f.get('relay_after_events_per_second'))} events/s.\n"
        + _relays(f.get("relays_events_per_second"))
    )


def _relays(figures: dict[str, float] | None) -> str:
    """Scale-out: relays side by side (processes sharing the slices), each against one."""
    if not figures:
        return ""
    one = figures.get("1")
    cells = [
        f"{count} relay{'s' if count != '1' else ''} {_fmt(rate)} events/s"
        + (f" ({rate / one:.2f}x)" if one and count != "1" else "")
        for count, rate in figures.items()
    ]
    return (
        "\nScale-out, relay processes sharing the outbox's slices, draining the same events: "
        + ", ".join(cells)
        + ".\n"
    )


def _effects(data: dict[str, Any]) -> str:
    f = data["figures"]
    return (
        "## Side-effect ledger (`benchmarks/effects_ledger.py`)\n\n"
        f"{_fmt(f['steps'])} steps, one client: one-row insert and commit "
        f"{_fmt(f['commits_per_second'])} tx/s; ledger with a no-op call "
        f"{_fmt(f['ledger_noop_steps_per_second'])} steps/s; redelivery of a done step "
        f"{_fmt(f['redelivered_done_steps_per_second'])} steps/s; bare HTTP call "
        f"{_fmt(f['bare_http_calls_per_second'])} calls/s, through the ledger "
        f"{_fmt(f['http_through_ledger_calls_per_second'])} calls/s "
        f"({f['through_over_bare']:.2f}x the bare call).\n"
    )


def _pipeline(data: dict[str, Any], folder: Path) -> str:
    f = data["figures"]
    runs = f["runs"]
    lines = [
        "## The whole pipeline (`benchmarks/pipeline.py`)",
        "",
        "Writers commit at a fixed rate for the given time, through CDC (Debezium + Event "
        "Router) to the broker and the lake job (continuous, trigger "
        f"{f['trigger_seconds']:g} s). Latency: from `pg_xact_commit_timestamp` to the Delta "
        "commit that made the event queryable. Events/s per stage over each stage's own "
        "first-to-last span. CPU in cores (1.0 = one core busy) while the writers ran."
        + (f" Broker: {f['broker']}." if "broker" in f else ""),
        "",
        "| rate/s | keeps up | written/s | broker/s | lake/s | lake / broker | p50 s | p95 s | "
        "p99 s | commit-to-broker p99 s | drain s | CPU (cores) | load |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: |",
    ]
    for run in runs:
        speed, waits = run["events_per_second"], run["commit_to_queryable_seconds"]
        cpu = ", ".join(f"{name} {value:.2f}" for name, value in run["cpu_cores"].items())
        lines.append(
            f"| {run['rate']} | {'yes' if run['keeps_up'] else '**no**'} | "
            f"{_fmt(speed['written'])} | {_fmt(speed['broker'])} | {_fmt(speed['lake'])} | "
            f"{_fmt(run.get('lake_over_broker'), 2)} | {_fmt(waits['p50'], 2)} | "
            f"{_fmt(waits['p95'], 2)} | {_fmt(waits['p99'], 2)} | "
            f"{_fmt(run['commit_to_broker_seconds']['p99'], 2)} | {run['drain_seconds']} | "
            f"{cpu} | {run['load_average']} |"
        )
    knee = f.get("knee")
    lines += [
        "",
        f"Knee (first rate not kept up): **{knee if knee is not None else 'not reached'}**. "
        "Targets (issue 20, on the default stack): 10,000 events/s kept up; commit-to-queryable "
        "p95 < 2 s at 1,000 events/s and < 3 s at 5,000; lake ingest >= 1.0x the CDC rate of "
        "the same run (issue 15; the `max` row: writers as fast as they can).",
        "",
    ]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    labels = [str(run["rate"]) for run in runs]
    for key, style in (("p50", "o-"), ("p95", "s-"), ("p99", "^-")):
        left.plot(
            labels,
            [run["commit_to_queryable_seconds"][key] or 0 for run in runs],
            style,
            label=key,
        )
    left.set_xlabel("offered rate (events/s)")
    left.set_ylabel("commit-to-queryable (s)")
    left.set_title("Latency by rate")
    left.legend()
    for stage in ("written", "broker", "lake"):
        right.plot(labels, [run["events_per_second"][stage] for run in runs], "o-", label=stage)
    right.set_xlabel("offered rate (events/s)")
    right.set_ylabel("events/s")
    right.set_title("Events per second per stage")
    right.legend()
    fig.tight_layout()
    fig.savefig(folder / "pipeline.png", dpi=90)
    plt.close(fig)
    return "\n".join([*lines, "![pipeline latency and throughput](benchmarks/pipeline.png)", ""])


def render(results: dict[str, Any], page: Path, folder: Path, *, quick: bool) -> Path:
    """Write ``page`` and its PNGs in ``folder`` from ``results`` (benchmark -> JSON)."""
    folder.mkdir(parents=True, exist_ok=True)
    sections = [
        "# Benchmarks",
        "",
        "Generated by `make bench` (`python -m benchmarks.report`) from the JSON results in "
        "`docs/benchmarks/results/`; do not edit by hand. "
        + ("**Quick (smoke) sizes: these figures are not the published ones.** " if quick else "")
        + "Each script's docstring says what it measures and how; run one alone with "
        "`python -m benchmarks.<name>`.",
        "",
        "The machine is shared (other engineers' test runs): the load average before and "
        "after each benchmark is given, and scenarios that are compared are interleaved in one "
        "run so that the machine's state hits them alike.",
        "",
        "## Machine and commands",
        "",
        _machine(results),
        "",
        "Commands: "
        + "; ".join(f"`{data['command'].split(' --json')[0]}`" for data in results.values()),
        "",
        _headline(results),
    ]
    missing = [
        name
        for name in (
            "sdk_publish",
            "pipeline",
            "cdc_throughput",
            "lake_ingest",
            "relay_throughput",
            "effects_ledger",
        )
        if name not in results
    ]
    if missing:
        sections += [f"No results for: {', '.join(missing)}.", ""]
    if "pipeline" in results:
        sections.append(_pipeline(results["pipeline"], folder))
    if "sdk_publish" in results:
        sections.append(_sdk(results["sdk_publish"], folder))
    sections.append(_stages(results, folder))
    if "cdc_throughput" in results:
        sections.append(_cdc(results["cdc_throughput"]))
    if "lake_ingest" in results:
        sections.append(_lake(results["lake_ingest"], folder))
    if "relay_throughput" in results:
        sections.append(_relay(results["relay_throughput"]))
    if "effects_ledger" in results:
        sections.append(_effects(results["effects_ledger"]))
    notes = Path(__file__).with_name("notes.md")
    if notes.exists():
        sections.append(notes.read_text())
    page.parent.mkdir(parents=True, exist_ok=True)
    page.write_text("\n".join(section for section in sections if section is not None))
    return page
