"""The stack's process handling with real processes (no service needed)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from outbox_stack.process import ServiceProcess
from tests.fix_relay import wait_until

pytestmark = pytest.mark.timeout(60)


def group_alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    return True


def test_stopping_a_group_whose_program_ended_stops_what_it_left(tmp_path: Path) -> None:
    """A demo's lake job that refuses to start ends at once, while Spark's JVM, in its
    group, lives on: stopping the group must stop that too, not find nothing to stop."""
    process = ServiceProcess("leaver", tmp_path, marker="leaver-marker")
    leader = process.start(["sh", "-c", "sleep 300 & echo leaver-marker; exit 0"])
    try:
        wait_until(lambda: not process.is_running(), timeout=30, what="the program ended")
        assert group_alive(leader), "its child is left in the group"
        process.stop(timeout=10, group=True)
        wait_until(lambda: not group_alive(leader), timeout=15, what="the group stopped")
        assert not process.pid_file.exists()
    finally:
        if group_alive(leader):
            os.killpg(leader, signal.SIGKILL)


def test_stopping_a_program_that_is_not_running_is_a_no_op(tmp_path: Path) -> None:
    process = ServiceProcess("never", tmp_path, marker="never-marker")
    process.stop(timeout=1, group=True)
    assert not process.is_running()
