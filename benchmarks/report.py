"""Run every benchmark and write one report: JSON results, PNG plots, ``docs/benchmarks.md``.

    python -m benchmarks.report              # every benchmark, full size (about 15 minutes)
    python -m benchmarks.report --quick      # small sizes: a smoke run (about 8 minutes)
    python -m benchmarks.report --only sdk_publish pipeline
    python -m benchmarks.report --render     # only re-render the page from saved results

A full run writes ``docs/benchmarks/results/<name>.json`` (and the console output beside it
as ``<name>.log``), the plots in ``docs/benchmarks/`` and the page ``docs/benchmarks.md``.
The page opens with the headline figures side by side (CDC events/s and commit-to-broker
latency at 1,000 and 5,000 events/s on Apache Kafka, the broker's and Connect's resident
memory, the whole pipeline against its targets) and names the stack each result ran on.
A quick run writes the same under ``.cache/bench-quick/`` so that it never replaces the
published figures. Each benchmark runs in its own process, one after the other; one that
fails is reported (the run exits non-zero) and the others still run.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from benchmarks._render import render

__all__ = ["BENCHMARKS", "main"]

# name -> (full-size arguments, quick arguments)
BENCHMARKS: dict[str, tuple[list[str], list[str]]] = {
    "sdk_publish": ([], ["--seconds", "12", "--round-seconds", "3", "--clients", "1"]),
    "cdc_throughput": ([], ["--events", "5000", "--seconds", "5"]),
    "relay_throughput": ([], ["--events", "5000", "--rounds", "1"]),
    "lake_ingest": (
        [],
        ["--rates", "1000", "--seconds", "20", "--backlog", "20000"],
    ),
    "effects_ledger": ([], ["--steps", "100"]),
    "pipeline": ([], ["--rates", "500", "1000", "--seconds", "6", "--drain-seconds", "60"]),
}


def run_one(name: str, arguments: list[str], results: Path) -> bool:
    """Run one benchmark, echoing and keeping its output; True when it succeeded."""
    command = [sys.executable, "-m", f"benchmarks.{name}", *arguments]
    command += ["--json", str(results / f"{name}.json")]
    print(f"\n=== {' '.join(command[1:])}", flush=True)
    with (results / f"{name}.log").open("w") as log:
        process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        assert process.stdout is not None
        for line in process.stdout:
            sys.stdout.write(line)
            log.write(line)
        code = process.wait()
    if code != 0:
        print(f"=== {name} failed (exit {code}); see {results / (name + '.log')}", flush=True)
    return code == 0


def main() -> None:
    parser = argparse.ArgumentParser(description="Run the benchmarks; write the report.")
    parser.add_argument("--quick", action="store_true", help="small sizes (CI smoke)")
    parser.add_argument("--only", nargs="+", choices=sorted(BENCHMARKS), help="run these")
    parser.add_argument("--render", action="store_true", help="only render saved results")
    parser.add_argument("--out", type=Path, help="folder for the page (default: see above)")
    arguments = parser.parse_args()
    out = arguments.out or (Path(".cache/bench-quick") if arguments.quick else Path("docs"))
    results = out / "benchmarks" / "results"
    results.mkdir(parents=True, exist_ok=True)

    failed = []
    if not arguments.render:
        for name in arguments.only or list(BENCHMARKS):
            full, quick = BENCHMARKS[name]
            if not run_one(name, quick if arguments.quick else full, results):
                failed.append(name)
    loaded: dict[str, Any] = {}
    for path in sorted(results.glob("*.json")):
        loaded[path.stem] = json.loads(path.read_text())
    page = render(loaded, out / "benchmarks.md", out / "benchmarks", quick=arguments.quick)
    print(f"\nreport: {page}")
    if failed:
        sys.exit(f"failed: {', '.join(failed)}")


if __name__ == "__main__":
    main()
