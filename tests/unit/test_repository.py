"""The repository tracks source, never the state a run leaves behind.

A lake checkpoint once slipped into a commit (``.lake/``): every fresh clone then started the
demo's lake job from offsets of a broker that no longer existed, and it skipped the first
events of the new one. These folders are written by runs (the stack, the lake, caches)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RUN_STATE = (".lake", ".stack", ".cache", ".venv", "spark-warehouse", "metastore_db")


def test_no_run_state_is_tracked_by_git() -> None:
    if not (ROOT / ".git").exists() or shutil.which("git") is None:
        pytest.skip("not a git checkout")
    tracked = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "--", *RUN_STATE],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    ).stdout.split()
    assert tracked == [], f"run state tracked by git (git rm -r --cached it): {tracked[:5]}"


@pytest.mark.parametrize("folder", RUN_STATE[:4])
def test_run_state_is_ignored(folder: str) -> None:
    if not (ROOT / ".git").exists() or shutil.which("git") is None:
        pytest.skip("not a git checkout")
    # A path inside the folder (a pattern may name folders only), or the folder itself where
    # it is a symbolic link (CI links .cache to its checkout's): git stops at links.
    path = folder if (ROOT / folder).is_symlink() else f"{folder}/x"
    ignored = subprocess.run(
        ["git", "-C", str(ROOT), "check-ignore", "-q", "--no-index", path],
        timeout=30,
    )
    assert ignored.returncode == 0, f"{folder}/ is not in .gitignore"
