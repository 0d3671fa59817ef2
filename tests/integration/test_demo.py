"""The README's main job, `outbox demo`: the whole pipeline on a stack of its own."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import tempfile
from pathlib import Path

import pytest
import sqlalchemy as sa

from outbox import Event, Outbox
from outbox_stack import PostgresCluster, StackSettings
from outbox_stack.demo import LAKE_JOB_READY
from outbox_stack.local import LocalStack
from tests.cli import run_outbox
from tests.fix_postgres import ROOT, free_port
from tests.fix_relay import wait_until

pytestmark = pytest.mark.timeout(480)


def test_demo_runs_the_whole_pipeline_and_reports_from_the_lake() -> None:
    """A stack of its own (Postgres, broker, Connect on free ports), the order service, CDC,
    Spark into the lake, and the report: what the lake says equals what was committed."""
    # mkdtemp makes it 0700: as root, the postgres user cannot reach it, like a clone in
    # root's home; the stack puts the server's files in a folder of that user's own.
    folder = Path(tempfile.mkdtemp(prefix="outbox-demo-"))
    settings = StackSettings(
        dir=folder,
        postgres_port=free_port(),
        broker_port=free_port(),
        connect_port=free_port(),
        downloads=ROOT / ".cache" / "stack",
    )
    env = {
        "OUTBOX_STACK_DIR": str(folder),
        "OUTBOX_STACK_DOWNLOADS": str(settings.downloads),
        "OUTBOX_STACK_POSTGRES_PORT": str(settings.postgres_port),
        "OUTBOX_STACK_BROKER_PORT": str(settings.broker_port),
        "OUTBOX_STACK_BROKER_CONTROLLER_PORT": str(free_port()),
        "OUTBOX_STACK_CONNECT_PORT": str(settings.connect_port),
        "OUTBOX_STACK_RELAY_PORT": str(free_port()),
        "OUTBOX_LAKE_ROOT": str(folder / "lake"),
        "COLUMNS": "120",
        # The demo's lake job as users run it: not on the suite's first-tier-only JIT.
        "SPARK_SUBMIT_OPTS": "",
    }
    try:
        result = run_outbox("demo", "--orders", "20", env=env, timeout=450)
        assert result.returncode == 0, result.stderr[-3000:]
        summary = re.search(r"placed (\d+), paid (\d+), rejected (\d+)", result.stdout)
        assert summary is not None, result.stdout
        placed, paid, rejected = (int(group) for group in summary.groups())
        assert placed + rejected == 20 and rejected == 2
        assert f"all {placed + paid} events on outbox.event.order" in result.stdout
        events = dict(re.findall(r"│ (Order\w+)\s+│ (\d+)", result.stdout))
        assert events == {"OrderPlaced": str(placed), "OrderPaid": str(paid)}
        statuses = dict(re.findall(r"│ (paid|placed)\s+│ (\d+)", result.stdout))
        assert statuses == {"paid": str(paid), "placed": str(placed - paid)}
        latency = re.search(r"commit-to-queryable latency .* p50 ([\d.]+) s", result.stdout)
        assert latency is not None, result.stdout
        # The figure is reported; how fresh the lake is is measured by the benchmarks
        # (docs/benchmarks.md), never bounded in a test: it depends on the machine's load.
        assert float(latency.group(1)) > 0, result.stdout
        logs = dict(LOG_LINE.findall(result.stdout))
        assert set(logs) == {"lake job (Spark)", "Kafka Connect"}, result.stdout
        assert all(Path(path).exists() for path in logs.values())
        assert LAKE_JOB_READY in Path(logs["lake job (Spark)"]).read_text()
        console = result.stdout + result.stderr
        assert not re.search(r"\bWARN|log4j|Exception", console), "services write to files only"
        assert "outbox lake query" in result.stdout and "outbox stack down" in result.stdout
        # The lake job keeps running as a service of the stack: status shows it, and it
        # lands what is published after the demo.
        assert _lake_jobs_of(folder), "the demo left its lake job running"
        shown = run_outbox("stack", "status", "--json", env=env, timeout=60)
        services = {service["name"]: service for service in json.loads(shown.stdout)["services"]}
        lake = services["lake"]
        assert lake["running"] and lake["address"].split()[:4] == [
            "ingest",
            "job",
            "into",
            str(folder / "lake"),
        ], shown.stdout
        assert services["relay"]["running"], shown.stdout
        assert services["relay"]["address"].startswith("auto mode"), shown.stdout
        listed = run_outbox("lake", "tables", env=env, timeout=60)
        assert listed.returncode == 0, listed.stderr
        assert "freshness: last commit" in listed.stdout, listed.stdout
        assert "lag behind Kafka unknown" not in listed.stdout, listed.stdout
        exported = run_outbox("stack", "env", env=env, timeout=60)
        url = re.search(r"^export OUTBOX_DATABASE_URL=(\S+)$", exported.stdout, re.M)
        assert url is not None, exported.stdout
        engine = sa.create_engine(shlex.split(url.group(1))[0])
        try:
            with engine.begin() as connection:
                Outbox().publish(connection, Event("later", "1", "Published", {"after": "demo"}))
        finally:
            engine.dispose()

        def landed_later() -> bool:
            found = run_outbox(
                "lake",
                "query",
                "--format",
                "csv",
                "SELECT count(*) FROM events WHERE aggregate_type = 'later'",
                env=env,
                timeout=60,
            )
            return found.returncode == 0 and found.stdout.split()[-1] == "1"

        wait_until(landed_later, timeout=120, what="an event published after the demo landed")
        # The relay cleans up: every row CDC delivered leaves the outbox.
        engine = sa.create_engine(shlex.split(url.group(1))[0])
        try:

            def drained() -> bool:
                with engine.connect() as connection:
                    return (
                        connection.execute(sa.text("SELECT count(*) FROM outbox.outbox")).scalar()
                        == 0
                    )

            wait_until(drained, timeout=120, what="the outbox drained by the relay")
        finally:
            engine.dispose()
        down = run_outbox("stack", "down", env=env, timeout=180)
        assert down.returncode == 0, down.stderr[-2000:]
        # The job's Spark JVM (a session of its own) exits once its driver has: allow it that.
        wait_until(lambda: not _lake_jobs_of(folder), timeout=60, what="the lake job stopped")
        assert "lake      stopped" not in down.stdout  # stopped on purpose: no line left

        # The stack destroyed, the lake kept: the new broker's topics are other logs than the
        # lake's checkpoint read. The demo refuses, saying what to do, instead of taking the
        # new topics' first records as read (its warm-up event would never arrive).
        destroyed = run_outbox("stack", "destroy", "--yes", env=env, timeout=120)
        assert destroyed.returncode == 0, destroyed.stderr[-2000:]
        again = run_outbox("demo", "--orders", "5", env=env, timeout=300)
        assert again.returncode != 0
        refusal = " ".join((again.stdout + again.stderr).split())
        assert "was filled from another broker than this stack's" in refusal, refusal[-2000:]
        assert "OUTBOX_LAKE_FAIL_ON_DATA_LOSS=false" in refusal
        # Not left running: the driver has exited; its JVM follows within moments.
        wait_until(lambda: not _lake_jobs_of(folder), timeout=30, what="the refused job stopped")
    finally:
        LocalStack(settings).down()
        PostgresCluster(settings).destroy()
        shutil.rmtree(folder, ignore_errors=True)


LOG_LINE = re.compile(r"^  (lake job \(Spark\)|Kafka Connect)\s+(/\S+)$", re.MULTILINE)


def _lake_jobs_of(folder: Path) -> list[int]:
    """Pids of the demo's lake job (and its Spark JVM) writing into ``folder``'s lake."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            command = (entry / "cmdline").read_bytes()
            environment = (entry / "environ").read_bytes()
        except OSError:
            continue  # gone meanwhile
        ours = str(folder).encode() in environment
        # The job, or its Spark JVM (the stack's broker and Connect are JVMs of the same
        # environment, and the demo leaves them running on purpose).
        if ours and (b"--lake-job" in command or b"pyspark" in command):
            found.append(int(entry.name))
    return found
