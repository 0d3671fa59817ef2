"""The README's main job, `outbox demo`, on a cluster of its own."""

from __future__ import annotations

import re
import shutil
import tempfile
from pathlib import Path

import pytest

from stack import PostgresCluster, StackSettings
from tests.cli import run_outbox
from tests.fix_postgres import free_port

pytestmark = pytest.mark.timeout(240)


def test_demo_places_orders_and_shows_the_outbox() -> None:
    folder = Path(tempfile.mkdtemp(prefix="outbox-demo-"))
    folder.chmod(0o755)
    port = free_port()
    env = {
        "OUTBOX_STACK_DIR": str(folder),
        "OUTBOX_STACK_POSTGRES_PORT": str(port),
        "COLUMNS": "120",
    }
    try:
        result = run_outbox("demo", "--orders", "20", env=env, timeout=200)
        assert result.returncode == 0, result.stderr
        summary = re.search(r"placed (\d+), paid (\d+), rejected (\d+)", result.stdout)
        assert summary is not None, result.stdout
        placed, paid, rejected = (int(group) for group in summary.groups())
        assert placed + rejected == 20 and rejected == 2
        events = dict(re.findall(r"│ order\s+│ (\w+)\s+│ (\d+)", result.stdout))
        assert events == {"OrderPlaced": str(placed), "OrderPaid": str(paid)}
    finally:
        PostgresCluster(StackSettings(dir=folder, postgres_port=port)).destroy()
        shutil.rmtree(folder, ignore_errors=True)
