"""A Spark standalone cluster on this machine, from the PySpark installation: one master and
N workers on loopback, for the lake job's scale-out test and benchmark.

The PySpark wheel ships no ``sbin/start-*.sh`` scripts, but its ``bin/spark-class`` runs the
master and worker classes. Everything listens on 127.0.0.1 (``SPARK_LOCAL_IP``, ``--host``);
web UIs are on ports of their own (the master's JSON at ``/json`` says which workers are
alive). Each process is a :class:`~outbox_stack.process.ServiceProcess` (pid file, stopped by pid).
"""

from __future__ import annotations

import json
import os
import socket
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from outbox_stack.errors import StackError
from outbox_stack.process import ServiceProcess

__all__ = ["SparkCluster"]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent


@dataclass
class SparkCluster:
    """``up()`` starts the master and ``workers`` workers (``cores`` and ``memory`` each)."""

    home: Path
    workers: int = 2
    cores: int = 1
    memory: str = "1g"
    port: int = field(default_factory=_free_port)
    ui_port: int = field(default_factory=_free_port)

    @property
    def master_url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def _processes(self) -> list[ServiceProcess]:
        master = ServiceProcess("spark-master", self.home, "deploy.master.Master")
        return [master] + [
            ServiceProcess(f"spark-worker-{n}", self.home, "deploy.worker.Worker")
            for n in range(self.workers)
        ]

    def _env(self) -> dict[str, str]:
        return {
            **os.environ,
            "SPARK_HOME": str(_spark_home()),
            "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_WORKER_DIR": str(self.home / "work"),
            "SPARK_LOG_DIR": str(self.home / "logs"),
        }

    def up(self, timeout: float = 120.0) -> None:
        spark_class = str(_spark_home() / "bin" / "spark-class")
        master, *workers = self._processes()
        master.start(
            [
                spark_class,
                "org.apache.spark.deploy.master.Master",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--webui-port",
                str(self.ui_port),
            ],
            env=self._env(),
        )
        for worker in workers:
            worker.start(
                [
                    spark_class,
                    "org.apache.spark.deploy.worker.Worker",
                    self.master_url,
                    "--host",
                    "127.0.0.1",
                    "--cores",
                    str(self.cores),
                    "--memory",
                    self.memory,
                    "--webui-port",
                    str(_free_port()),
                ],
                env=self._env(),
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.alive_workers() == self.workers:
                return
            time.sleep(0.5)
        self.down()
        raise StackError(
            f"the Spark master saw {self.alive_workers()} of {self.workers} workers within "
            f"{timeout:.0f} s; see the logs in {self.home}"
        )

    def status(self) -> dict[str, Any]:
        """The master's own view (``/json``): alive workers, running and finished apps."""
        url = f"http://127.0.0.1:{self.ui_port}/json/"
        with urllib.request.urlopen(url, timeout=5) as answer:
            return json.loads(answer.read())  # type: ignore[no-any-return]

    def alive_workers(self) -> int:
        try:
            state = self.status()
        except (OSError, ValueError):  # not answering yet, or not with its JSON yet
            return 0
        return sum(1 for worker in state.get("workers", []) if worker.get("state") == "ALIVE")

    def worker_pids(self) -> list[int]:
        """The running workers' pids (a test kills one mid-batch)."""
        return [pid for process in self._processes()[1:] if (pid := process.pid()) is not None]

    def down(self) -> None:
        for process in reversed(self._processes()):
            process.stop(timeout=30.0, group=True)
