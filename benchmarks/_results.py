"""Machine-readable results: every benchmark can write what it printed as JSON.

Each script takes ``--json PATH``; ``benchmarks.report`` runs them all and renders
``docs/benchmarks.md`` from these files. A file holds the benchmark's name, the command line,
the machine (cores, memory, load average before and after: the machine is shared) and the
figures, as plain JSON values.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

__all__ = ["Results", "machine"]


def machine() -> dict[str, Any]:
    """What the figures were measured on, and how busy it was at that moment."""
    memory = None
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemTotal:"):
                    memory = round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return {
        "architecture": platform.machine(),
        "cores": os.cpu_count(),
        "memory_gib": memory,
        "python": platform.python_version(),
        "load_average": [round(value, 2) for value in os.getloadavg()],
    }


class Results:
    """Figures of one benchmark run, written as JSON at the end (when a path was given)."""

    def __init__(self, name: str, path: str | None) -> None:
        self.path = Path(path) if path else None
        self.started = time.monotonic()
        self.data: dict[str, Any] = {
            "benchmark": name,
            "command": "python -m benchmarks." + name + " " + " ".join(sys.argv[1:]),
            "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "machine_before": machine(),
            "figures": {},
        }

    @property
    def figures(self) -> dict[str, Any]:
        return self.data["figures"]  # type: ignore[no-any-return]

    def write(self) -> None:
        if self.path is None:
            return
        self.data["machine_after"] = machine()
        self.data["seconds"] = round(time.monotonic() - self.started, 1)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(self.data, indent=2, default=str) + "\n")
