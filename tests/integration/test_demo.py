"""The README's main job, `outbox demo`: the whole pipeline on a stack of its own."""

from __future__ import annotations

import re
import shutil
import tempfile
from pathlib import Path

import pytest

from stack import PostgresCluster, StackSettings
from stack.local import LocalStack
from tests.cli import run_outbox
from tests.fix_postgres import ROOT, free_port

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
        "OUTBOX_STACK_CONNECT_PORT": str(settings.connect_port),
        "OUTBOX_LAKE_ROOT": str(folder / "lake"),
        "COLUMNS": "120",
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
        assert re.search(r"commit-to-queryable latency .* p50 [\d.]+ s", result.stdout)
    finally:
        LocalStack(settings).down()
        PostgresCluster(settings).destroy()
        shutil.rmtree(folder, ignore_errors=True)
