"""The benchmark tooling: the Delta log follower, the CPU meter, the memory sampler, the
names of what the figures ran on, and the report's rendering."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from benchmarks._probes import CpuMeter, DeltaLogFollower, MemorySampler
from benchmarks._render import render
from benchmarks._shared import broker_name, connect_name, side_by_side
from outbox.settings import KafkaSettings
from outbox_stack.artifacts import java_versions
from outbox_stack.local import LocalStack
from outbox_stack.settings import StackSettings


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


def test_the_memory_sampler_keeps_the_idle_figure_and_the_peak() -> None:
    # The child holds 8 MiB, waits for "grow", then holds 200 MiB more (touched, so
    # resident) and says "grown": the peak is at least 200 MiB above the idle figure.
    child_code = (
        "import sys\n"
        "small = bytearray(8 << 20)\n"
        "print('ready', flush=True)\n"
        "sys.stdin.readline()\n"
        "big = bytearray(200 << 20)\n"
        "print('grown', flush=True)\n"
        "sys.stdin.readline()\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", child_code],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdin is not None and child.stdout is not None
    try:
        assert child.stdout.readline().strip() == "ready"
        sampler = MemorySampler({"child": child.pid, "gone": 2**22 + 1}, interval=0.05)
        idle = sampler.idle(seconds=0.2)
        sampler.start()
        child.stdin.write("grow\n")
        child.stdin.flush()
        assert child.stdout.readline().strip() == "grown"
        peak = sampler.stop()
    finally:
        child.kill()
        child.wait(timeout=10)
    assert set(idle) == set(peak) == {"child"}  # a process that is not there is left out
    assert idle["child"] >= 8 << 20
    assert peak["child"] - idle["child"] >= 190 << 20, (idle, peak)


def test_what_the_figures_ran_on_comes_from_the_pinned_versions(tmp_path: Path) -> None:
    versions = java_versions()
    assert connect_name() == (
        f"Kafka Connect {versions['kafka.version']}, Debezium {versions['debezium.version']}"
    )
    own = LocalStack(StackSettings(dir=tmp_path), KafkaSettings(bootstrap_servers=None))
    assert broker_name(own).startswith(f"Apache Kafka {versions['kafka.version']} ")
    external = LocalStack(
        StackSettings(dir=tmp_path), KafkaSettings(bootstrap_servers="kafka.example:9092")
    )
    assert broker_name(external) == "external Kafka (OUTBOX_KAFKA_BOOTSTRAP_SERVERS)"


def test_figures_print_side_by_side(capsys: pytest.CaptureFixture[str]) -> None:
    side_by_side("MiB", {"broker": {"idle": 300.0, "peak": 420.4}, "connect": {"idle": 512.0}})
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["MiB", "broker", "connect"]
    assert lines[1].split() == ["idle", "300", "512"]
    assert lines[2].split() == ["peak", "420", "-"]


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
            "stack": "Apache Kafka 4.3.0 (KRaft, one node, loopback); Kafka Connect 4.3.0",
            "figures": {
                "runs": [
                    run,
                    {
                        **run,
                        "rate": 5000,
                        "commit_to_queryable_seconds": {"p50": 2.0, "p95": 3.4, "p99": 4.0},
                    },
                    {**run, "rate": "max", "keeps_up": False},
                ],
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
                "broker": "Apache Kafka 4.3.0, KRaft, one node",
                "freshness": {
                    "1000": {
                        "floor": [{"p50": 2.0, "p95": 3.0, "events_per_second": 990.0}],
                        "ours": [
                            {
                                "p50": 2.5,
                                "p95": 3.6,
                                "events_per_second": 980.0,
                                "typed": {"p50": 6.0, "p95": 7.0},
                            }
                        ],
                    }
                },
                "catch_up": {
                    "backlog": 1000,
                    "floor": 100.0,
                    "ours": 90.0,
                    "ratio": 0.9,
                    "ours_with_typed": 45.0,
                },
                "cold_start": {"wall_seconds": 40.0, "first_batch_seconds": 25.0},
            },
        },
    }
    cdc = {
        "command": "python -m benchmarks.cdc_throughput",
        "machine_before": machine,
        "stack": "Apache Kafka 4.3.0 (KRaft, one node, loopback); Kafka Connect 4.3.0",
        "figures": {
            "events": 1000,
            "router_events_per_second": 900.0,
            "raw_events_per_second": 1000.0,
            "ratio": 0.9,
            "commit_to_broker_seconds": {
                "1000": {"written_per_second": 999.0, "p50": 0.05, "p95": 0.08, "p99": 0.1},
                "5000": {"written_per_second": 4990.0, "p50": 0.06, "p95": 0.12, "p99": 0.2},
            },
            "resident_memory_mib": {
                "broker": {"idle": 400.0, "peak": 450.0},
                "connect": {"idle": 500.0, "peak": 610.0},
            },
            "stack_started_by_run": False,
        },
    }
    page = render(
        json.loads(json.dumps({**results, "cdc_throughput": cdc})),
        tmp_path / "b.md",
        tmp_path / "b",
        quick=True,
    )
    text = page.read_text()
    assert "Knee (first rate not kept up): **max**" in text
    assert "| publish / plain | 0.96 | >= 0.9 met |" in text
    assert "No results for: relay_throughput, effects_ledger." in text
    assert "not the published ones" in text
    assert "| 1,000 | 2.00 / 3.00 | 990 | 2.50 / 3.60 | 980 | 1.20 | 7.00 |" in text
    assert "floor 100 events/s, ours 90 events/s into `events` (ratio 0.90, target >= 0.8)" in text
    assert "45 events/s until the typed tables" in text
    for plot in ("pipeline.png", "sdk_publish.png", "stages.png"):
        assert (tmp_path / "b" / plot).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"(benchmarks/{plot})" in text
    # The headline figures, side by side: CDC at both rates, the two JVMs' memory, and the
    # whole pipeline against issue 20's targets.
    assert "| commit-to-broker | 1,000 events/s | 5,000 events/s |" in text
    assert "| p99 (ms) | 100 | 200 |" in text
    assert "| resident memory (RSS, MiB) | broker | Connect |" in text
    assert "| peak, during the run | 450 | 610 |" in text
    assert "Idle: the stack was already running when the run started" in text
    assert "| keeps up at 10,000 events/s | yes | - | not run |" in text
    assert "| commit-to-queryable p95 at 1,000 events/s | < 2 s | 1.90 s | met |" in text
    assert "| commit-to-queryable p95 at 5,000 events/s | < 3 s | 3.40 s | **missed** |" in text
    assert "Commit-to-broker at 5,000 events/s (read committed): p50 60 ms" in text
    # The lake result names no stack of its own but its broker: shown as recorded.
    assert "not recorded" not in text


def test_the_report_reads_results_from_before_apache_kafka(tmp_path: Path) -> None:
    machine = {"cores": 2, "memory_gib": 24, "load_average": [1.0, 1.0, 1.0]}
    old = {
        "command": "python -m benchmarks.cdc_throughput",
        "machine_before": machine,
        "figures": {
            "events": 1000,
            "router_events_per_second": 900.0,
            "raw_events_per_second": 1000.0,
            "ratio": 0.9,
            "commit_to_broker_seconds_at_1000": {"p50": 0.098, "p95": 0.211, "p99": 0.273},
        },
    }
    page = render({"cdc_throughput": old}, tmp_path / "b.md", tmp_path / "b", quick=False)
    text = page.read_text()
    assert "| cdc_throughput |" in text and "| not recorded |" in text
    assert "ran before the local stack moved to Apache Kafka" in text
    assert "| commit-to-broker | 1,000 events/s |" in text
    assert "Commit-to-broker at 1,000 events/s (read committed): p50 98 ms" in text
    assert "resident memory" not in text
