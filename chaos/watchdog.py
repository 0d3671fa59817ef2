"""The watchdog: a component of the pipeline that stops outside a fault fails the run.

:class:`Watchdog` watches every component between faults: a process that stopped on its
own (PostgreSQL, the broker, Connect, a relay, the lake job), or a connector that failed or
vanished while no fault acted on PostgreSQL, the broker or Connect, is a **halt**: recorded
with the component's last log lines (:data:`LOG_LINES`), and the run fails. The watchdog then
starts the component again, so that the run goes on to its checks (which say whether
anything was lost besides); a halt is never only a restart. A component that a fault acts on
(the fault holds its lock, :attr:`Component.resources`) is left alone: the fault's own kill
is planned, and the fault brings it back. (No service here: :class:`Component` is what
``chaos.services`` gives it, so tests give it fakes.)
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["LOG_LINES", "Clock", "Component", "Halt", "Watchdog", "exit_status", "log_tail"]

LOG_LINES = 30
"""How many of a halted component's last log lines the report shows."""
_TAIL_BYTES = 256 * 1024


@dataclass(frozen=True)
class Clock:
    """Seconds since the load phase started."""

    started: float = field(default_factory=time.monotonic)

    def now(self) -> float:
        return round(time.monotonic() - self.started, 1)


@dataclass
class Halt:
    """A component that stopped (or a connector that failed) while no fault acted on it."""

    at: float
    component: str
    what: str
    log_file: str
    log: tuple[str, ...]
    """Its log's last lines, as they were when the watchdog found it stopped."""
    restart: str = "starting it again"
    """What the watchdog did next (started it again, or why it could not)."""

    @property
    def problem(self) -> str:
        return (
            f"{self.component} found stopped outside any fault at t+{self.at:g}s: {self.what} "
            f"(log: {self.log_file})"
        )


def log_tail(path: Path, lines: int = LOG_LINES) -> tuple[str, ...]:
    """The last ``lines`` lines of a log file (read from its end: a worker's log is large)."""
    try:
        with path.open("rb") as log:
            log.seek(0, os.SEEK_END)
            size = log.tell()
            log.seek(max(0, size - _TAIL_BYTES))
            text = log.read().decode(errors="replace")
    except OSError:
        return ()
    return tuple(text.splitlines()[-lines:])


def exit_status(pid: int | None, timeout: float = 10.0) -> str:
    """How a child process of this run ended, if it is ours and not reaped yet. A killed
    JVM can be reaped only once all its threads have exited: waits up to ``timeout``."""
    if pid is None:
        return "exited"
    deadline = time.monotonic() + timeout
    while True:
        try:
            reaped, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return f"pid {pid} exited"  # not our child, or already reaped
        if reaped != 0:
            break
        if time.monotonic() > deadline:
            return f"pid {pid} not running"
        time.sleep(0.05)
    if os.WIFSIGNALED(status):
        return f"pid {pid} killed by {signal.Signals(os.WTERMSIG(status)).name}"
    return f"pid {pid} exited with status {os.waitstatus_to_exitcode(status)}"


@dataclass(frozen=True)
class Component:
    """Something the watchdog watches: how to tell that it stopped, where its log is, how to
    start it again. ``resources``: the locks of the faults that may stop it on purpose (the
    watchdog looks only when it can take them all)."""

    name: str
    resources: tuple[str, ...]
    stopped: Callable[[], str | None]
    """None while it runs; else what happened, in words (``pid 123 exited with status 1``)."""
    log_file: Path
    restart: Callable[[], str]
    """Start it again; what was done, in words."""


class Watchdog(threading.Thread):
    """Records every halt (a component stopped outside a fault), with its last log lines,
    and starts the component again; every ``interval`` seconds, until ``stop``."""

    def __init__(
        self,
        components: Sequence[Component],
        locks: Mapping[str, threading.Lock],
        clock: Clock,
        stop: threading.Event,
        interval: float = 2.0,
    ) -> None:
        super().__init__(name="watchdog", daemon=True)
        self._components = list(components)
        self._locks = locks
        self._clock = clock
        self._stop_event = stop
        self._interval = interval
        self._given_up: set[str] = set()
        self.halts: list[Halt] = []
        """Every halt, in order: each one fails the run."""
        self.errors: list[str] = []
        """Looks that failed (Connect's REST API not answering...): notes, not halts."""

    def run(self) -> None:
        while not self._stop_event.wait(self._interval):
            self.check()
        self.check(restart=False)  # whatever stopped since the last look

    def check(self, *, restart: bool = True) -> None:
        for component in self._components:
            if component.name not in self._given_up:
                self._look(component, restart=restart)

    def _look(self, component: Component, *, restart: bool) -> None:
        held: list[threading.Lock] = []
        try:
            for resource in component.resources:
                lock = self._locks[resource]
                if not lock.acquire(blocking=False):
                    return  # a fault is acting on it (or on what it needs)
                held.append(lock)
            what = component.stopped()
            if what is None:
                return
            halt = Halt(
                self._clock.now(),
                component.name,
                what,
                str(component.log_file),
                log_tail(component.log_file),  # before a restart writes to it
            )
            self.halts.append(halt)
            if not restart:
                halt.restart = "left stopped (the run is ending)"
                self._given_up.add(component.name)
                return
            try:
                halt.restart = component.restart()
            except Exception as error:  # recorded with the halt
                halt.restart = f"could not start it again: {type(error).__name__}: {error}"
                self._given_up.add(component.name)
        except Exception as error:  # a look that failed is not a halt
            self.errors.append(f"{component.name}: {type(error).__name__}: {error}")
        finally:
            for lock in reversed(held):
                lock.release()
