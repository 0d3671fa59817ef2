"""A long-running service process of the local stack: started detached, found by pid file.

The pid file is the only state: ``is_running`` checks that the recorded process is alive
and is still the program we started (its command line names it), so a recycled pid is
never mistaken for ours. ``stop`` sends SIGTERM, waits, and only then SIGKILL. With
``group=True`` (a program with children of its own, such as a Spark driver and its JVM) the
SIGTERM goes to the program alone, which stops its children cleanly, and ``stop`` waits until
no process of the group it started is left; SIGKILL, if needed, goes to the whole group.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from outbox_stack.errors import StackError

__all__ = ["ServiceProcess"]


@dataclass(frozen=True)
class ServiceProcess:
    name: str
    home: Path
    marker: str  # a word of the command line that identifies the program

    @property
    def pid_file(self) -> Path:
        return self.home / f"{self.name}.pid"

    @property
    def log_file(self) -> Path:
        return self.home / f"{self.name}.log"

    def pid(self) -> int | None:
        try:
            pid = int(self.pid_file.read_text().strip())
        except (FileNotFoundError, ValueError):
            return None
        try:
            command_line = Path(f"/proc/{pid}/cmdline").read_bytes()
            stat = Path(f"/proc/{pid}/stat").read_text()
        except (FileNotFoundError, ProcessLookupError):
            return None
        # An empty command line: the process is still loading its program (exec). Any other
        # line without our marker: the pid was recycled by another program.
        if command_line and self.marker.encode() not in command_line:
            return None
        if stat.rsplit(")", 1)[1].split()[0] == "Z":
            return None  # exited, not yet reaped
        return pid

    def is_running(self) -> bool:
        return self.pid() is not None

    def start(self, command: list[str], *, env: dict[str, str] | None = None) -> int:
        """Start ``command`` in its own session, output appended to the log file."""
        self.home.mkdir(parents=True, exist_ok=True)
        with self.log_file.open("ab") as log:
            process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env=env,
                cwd=self.home,
            )
        self.pid_file.write_text(f"{process.pid}\n")
        return process.pid

    def stop(self, *, timeout: float = 30.0, group: bool = False) -> None:
        """SIGTERM, wait up to ``timeout`` seconds, then SIGKILL. No-op when not running.

        ``group``: wait for the whole process group ``start`` made (its session), and SIGKILL
        all of it after ``timeout``.
        """
        pid = self.pid()
        if pid is None:
            if group:
                self._stop_left_group(timeout)
            self.pid_file.unlink(missing_ok=True)
            return
        os.kill(pid, signal.SIGTERM)
        self._finish_stop(pid, timeout, group=group)

    def _stop_left_group(self, timeout: float) -> None:
        """The program has ended (a crash, a refusal) but its group may live on: a Spark
        driver's JVM outlives its Python for a while. SIGTERM to the group, then SIGKILL."""
        try:
            leader = int(self.pid_file.read_text().strip())
        except (FileNotFoundError, ValueError):
            return
        if not _group_alive(leader):
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(leader, signal.SIGTERM)
        self._finish_stop(leader, timeout, group=True)

    def _finish_stop(self, pid: int, timeout: float, *, group: bool) -> None:
        if not self._wait_gone(pid, timeout, group=group):
            with contextlib.suppress(ProcessLookupError):
                (os.killpg if group else os.kill)(pid, signal.SIGKILL)
            if not self._wait_gone(pid, 10.0, group=group):
                raise StackError(f"{self.name} (pid {pid}) did not stop after SIGKILL")
        self.pid_file.unlink(missing_ok=True)

    def signal(self, signum: signal.Signals) -> None:
        """Send ``signum`` to the running process (tests pause and kill services with it)."""
        pid = self.pid()
        if pid is None:
            raise StackError(f"{self.name} is not running")
        os.kill(pid, signum)

    def tail(self, lines: int) -> list[str]:
        if not self.log_file.exists():
            return []
        return self.log_file.read_text(errors="replace").splitlines()[-lines:]

    def _wait_gone(self, pid: int, timeout: float, *, group: bool = False) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)  # reap it if it is our child
            if self.pid() != pid and not (group and _group_alive(pid)):
                return True
            time.sleep(0.05)
        return False


def _group_alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
