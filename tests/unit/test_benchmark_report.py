"""The benchmark tooling: the Delta log follower, the CPU meter and the report's rendering."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
from deltalake import write_deltalake

from benchmarks._probes import CpuMeter, DeltaLogFollower
from benchmarks._render import render


def test_the_follower_dates_each_event_by_the_commit_that_added_it(tmp_path: Path) -> None:
    table = tmp_path / "events"
    follower = DeltaLogFollower(table)
    assert follower.poll() == 0  # no table yet
    write_deltalake(
        str(table), pa.table({"event_id": ["a", "b"], "day": ["d1", "d2"]}), partition_by=["day"]
    )
    assert follower.poll() == 2
    write_deltalake(
        str(table),
        pa.table({"event_id": ["c"], "day": ["d 1"]}),
        mode="append",
        partition_by=["day"],
    )  # a partition value that the log escapes
    assert follower.poll() == 1 and follower.poll() == 0
    first = (table / "_delta_log" / f"{0:020d}.json").stat().st_mtime
    second = (table / "_delta_log" / f"{1:020d}.json").stat().st_mtime
    assert follower.queryable_at == {"a": first, "b": first, "c": second}
    assert [(version, rows) for version, _, rows in follower.commits] == [(0, 2), (1, 1)]


def test_the_cpu_meter_counts_a_busy_child_and_its_reaped_children() -> None:
    # The parent waits for "go", runs a child that burns 0.32 s of CPU and is reaped, says
    # "done", and idles: all of the child's CPU falls between start and stop. The kernel
    # counts CPU in ticks (10 ms, user and system time each rounded down): the child burns
    # 0.32 s so that at least 0.3 s is counted (0.29 was once, for a burn of 0.3 s).
    burn = "import time\nwhile time.process_time() < 0.32: pass"
    parent_code = (
        "import subprocess, sys, time\n"
        "sys.stdin.readline()\n"
        f"subprocess.run([sys.executable, '-c', {burn!r}])\n"
        "print('done', flush=True)\n"
        "time.sleep(60)\n"
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", parent_code],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert parent.stdin is not None and parent.stdout is not None
    try:
        meter = CpuMeter({"parent": parent.pid})
        meter.start()
        parent.stdin.write("go\n")
        parent.stdin.flush()
        assert parent.stdout.readline().strip() == "done"
        cores = meter.stop()
    finally:
        parent.kill()
        parent.wait(timeout=10)
    assert 0.3 <= meter.cpu_seconds["parent"] < 5, meter.cpu_seconds
    assert cores["parent"] > 0


def test_the_report_renders_every_section_and_plot(tmp_path: Path) -> None:
    run = {
        "rate": 1000,
        "keeps_up": True,
        "events_per_second": {"written": 1000.0, "broker": 999.0, "lake": 990.0},
        "commit_to_queryable_seconds": {"p50": 1.1, "p95": 1.9, "p99": 2.5},
        "commit_to_broker_seconds": {"p50": 0.05, "p95": 0.08, "p99": 0.1},
        "drain_seconds": 2.0,
        "cpu_cores": {"postgres": 0.1, "lake job": 0.9},
        "load_average": 3.0,
    }
    machine = {"cores": 2, "memory_gib": 24, "load_average": [1.0, 1.0, 1.0]}
    results = {
        "pipeline": {
            "command": "python -m benchmarks.pipeline --json x",
            "machine_before": machine,
            "figures": {
                "runs": [run, {**run, "rate": "max", "keeps_up": False}],
                "knee": "max",
                "trigger_seconds": 1.0,
            },
        },
        "sdk_publish": {
            "command": "python -m benchmarks.sdk_publish",
            "machine_before": machine,
            "figures": {
                "round_seconds": 1,
                "seconds": 1,
                "clients": {
                    "1": {
                        "tx_per_second": {"plain": 100.0, "publish, 1 event": 96.0},
                        "ratios": {"publish / plain": {"ratio": 0.96, "target": 0.9}},
                    }
                },
            },
        },
        "lake_ingest": {
            "command": "python -m benchmarks.lake_ingest",
            "machine_before": machine,
            "figures": {
                "events": 10,
                "append_events_per_second": 100.0,
                "dedup_events_per_second": 80.0,
                "dedup_over_append_time": 1.25,
                "batch_seconds_by_table_rows": {"100": 1.0, "1000": 1.1},
            },
        },
    }
    page = render(json.loads(json.dumps(results)), tmp_path / "b.md", tmp_path / "b", quick=True)
    text = page.read_text()
    assert "Knee (first rate not kept up): **max**" in text
    assert "| publish / plain | 0.96 | >= 0.9 met |" in text
    assert "No results for: cdc_throughput, relay_throughput, effects_ledger." in text
    assert "not the published ones" in text
    for plot in ("pipeline.png", "sdk_publish.png", "stages.png", "lake_batch_time.png"):
        assert (tmp_path / "b" / plot).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"(benchmarks/{plot})" in text
