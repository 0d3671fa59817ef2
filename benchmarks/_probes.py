"""What the whole-pipeline benchmark watches: when events became queryable in the lake, and
how much CPU each process of the pipeline used.

- :class:`DeltaLogFollower` reads the ``events`` table's Delta log as it grows: for each new
  commit, the event ids in the files it added, and the moment the commit file was written
  (its modification time: from then on a reader sees the rows). Reading only the new commits'
  own files keeps it cheap whatever the table's size. An event is queryable at the first
  commit that added it.
- :class:`CpuMeter` sums the CPU time of a process tree (live processes, plus the children
  each of them has already reaped), so that short-lived PostgreSQL backends and Spark's
  Python workers are counted too.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote

import psutil
import pyarrow.parquet as pq

__all__ = ["CpuMeter", "DeltaLogFollower", "own_cpu_seconds"]


@dataclass
class DeltaLogFollower:
    """Event id -> the wall-clock second its Delta commit became visible."""

    table: Path
    queryable_at: dict[str, float] = field(default_factory=dict)
    commits: list[tuple[int, float, int]] = field(default_factory=list)  # version, time, rows
    _next_version: int = 0

    def poll(self) -> int:
        """Read the commits written since the last poll; return how many events they added."""
        added = 0
        log = self.table / "_delta_log"
        while True:
            commit = log / f"{self._next_version:020d}.json"
            try:
                moment = commit.stat().st_mtime
                lines = commit.read_text().splitlines()
            except FileNotFoundError:
                return added
            rows = 0
            for line in lines:
                action = json.loads(line)
                if "add" not in action:
                    continue
                data = pq.read_table(
                    self.table / unquote(action["add"]["path"]), columns=["event_id"]
                )
                for event_id in data.column(0).to_pylist():
                    if event_id not in self.queryable_at:
                        self.queryable_at[event_id] = moment
                        rows += 1
            self.commits.append((self._next_version, moment, rows))
            added += rows
            self._next_version += 1


def _tree_seconds(root: psutil.Process) -> float:
    total = 0.0
    try:
        processes = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0.0
    for process in processes:
        try:
            times = process.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system + times.children_user + times.children_system
    return total


@dataclass
class CpuMeter:
    """CPU seconds of named process trees between :meth:`start` and :meth:`stop`."""

    pids: dict[str, int]
    _processes: dict[str, psutil.Process] = field(default_factory=dict)
    _started: dict[str, float] = field(default_factory=dict)
    _wall: float = 0.0
    cpu_seconds: dict[str, float] = field(default_factory=dict)

    def start(self) -> None:
        self._processes = {name: psutil.Process(pid) for name, pid in self.pids.items()}
        self._started = {name: _tree_seconds(p) for name, p in self._processes.items()}
        self._wall = time.monotonic()

    def stop(self) -> dict[str, float]:
        """Cores used by each tree over the interval (1.0: one core all the time)."""
        wall = time.monotonic() - self._wall
        self.cpu_seconds = {
            name: _tree_seconds(process) - self._started[name]
            for name, process in self._processes.items()
        }
        return {name: round(seconds / wall, 2) for name, seconds in self.cpu_seconds.items()}


def own_cpu_seconds() -> float:
    """CPU seconds this process used so far (user + system)."""
    times = os.times()
    return times.user + times.system
