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
- :class:`MemorySampler` samples the resident memory (RSS) of named processes (the broker's
  and Connect's JVMs): an idle figure before the load, the peak while it runs.
"""

from __future__ import annotations

import json
import os
import statistics
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote

import psutil
import pyarrow.parquet as pq

__all__ = ["CpuMeter", "DeltaLogFollower", "MemorySampler", "own_cpu_seconds", "resident_bytes"]


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


def resident_bytes(pid: int) -> int | None:
    """The resident memory (RSS, ``VmRSS`` of ``/proc/<pid>/status``) of one process, in
    bytes; None once it has gone."""
    try:
        return int(psutil.Process(pid).memory_info().rss)
    except psutil.NoSuchProcess:
        return None


@dataclass
class MemorySampler:
    """Resident memory of named processes, in bytes: :meth:`idle` samples them for a few
    seconds before any load (the median), :meth:`start` and :meth:`stop` sample them every
    ``interval`` seconds in a thread and keep each one's peak (the idle samples included:
    a JVM's resident memory seldom shrinks, so the peak is never below the idle figure)."""

    pids: dict[str, int]
    interval: float = 0.25
    peak: dict[str, int] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def sample(self) -> dict[str, int]:
        """One reading of every process still running; updates the peaks."""
        found = {}
        for name, pid in self.pids.items():
            rss = resident_bytes(pid)
            if rss is not None:
                found[name] = rss
                self.peak[name] = max(rss, self.peak.get(name, 0))
        return found

    def idle(self, seconds: float = 3.0) -> dict[str, int]:
        """The median of each process's readings over ``seconds``."""
        readings: dict[str, list[int]] = {name: [] for name in self.pids}
        end = time.monotonic() + seconds
        while True:
            for name, rss in self.sample().items():
                readings[name].append(rss)
            if time.monotonic() >= end:
                break
            time.sleep(self.interval)  # sampling at a pace: there is no event to await
        return {name: int(statistics.median(found)) for name, found in readings.items() if found}

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="memory-sampler", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval)

    def stop(self) -> dict[str, int]:
        """Stop sampling; each process's peak so far."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self.sample()
        return dict(self.peak)


def own_cpu_seconds() -> float:
    """CPU seconds this process used so far (user + system)."""
    times = os.times()
    return times.user + times.system
