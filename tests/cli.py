"""Run the `outbox` command as users do: a separate process, settings in its environment."""

from __future__ import annotations

import os
import subprocess
import sys


def run_outbox(
    *args: str, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "outbox_cli.main", *args],
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
