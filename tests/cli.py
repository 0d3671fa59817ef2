"""Run the `outbox` command as users do: a separate process, settings in its environment."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def run_outbox(
    *args: str,
    env: dict[str, str] | None = None,
    timeout: float = 120,
    cwd: Path | None = None,
    unset: tuple[str, ...] = (),
) -> subprocess.CompletedProcess[str]:
    """``outbox ARGS`` with ``env`` added to ours (``unset`` removed), run in ``cwd``."""
    environment = {**os.environ, **(env or {})}
    for name in unset:
        environment.pop(name, None)
    return subprocess.run(
        [sys.executable, "-m", "outbox_cli.main", *args],
        env=environment,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
