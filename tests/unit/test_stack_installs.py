"""System packages the stack installs as root: one install at a time across our processes
(``make test``'s two workers each start a stack at once, and apt-get refuses to run beside
another apt-get), and none when another process installed the package meanwhile."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from outbox_stack import artifacts


def test_two_processes_needing_postgres_install_it_once_one_at_a_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bin_dir = tmp_path / "bin"
    monkeypatch.setattr(artifacts.os, "geteuid", lambda: 0)
    monkeypatch.setattr(artifacts, "APT_LOCK_DIR", tmp_path / "lock")
    monkeypatch.setattr(artifacts, "CREATECLUSTER_CONF", tmp_path / "etc" / "createcluster.conf")
    running: list[str] = []
    installs: list[str] = []
    overlaps: list[str] = []

    def apt_install(package: str) -> None:  # what apt-get does, slowly
        if running:
            overlaps.append(package)
        running.append(package)
        installs.append(package)
        time.sleep(0.3)
        bin_dir.mkdir()
        (bin_dir / "initdb").touch()
        running.remove(package)

    monkeypatch.setattr(artifacts, "_apt_install", apt_install)
    errors: list[BaseException] = []

    def start_a_stack() -> None:
        try:
            artifacts.ensure_postgres_binaries(bin_dir)
        except BaseException as error:  # reported below, with the thread's name
            errors.append(error)

    threads = [threading.Thread(target=start_a_stack) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert not errors, errors
    assert installs == ["postgresql-15"] and not overlaps
    conf = (tmp_path / "etc" / "createcluster.conf").read_text()
    assert conf.count("create_main_cluster = false") == 1


def test_apt_get_waits_for_a_lock_held_by_an_apt_get_not_ours(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    commands: list[list[str]] = []

    class Done:
        returncode = 0
        stderr = ""

    def run(command: list[str], **_: object) -> Done:
        commands.append(command)
        return Done()

    monkeypatch.setattr(artifacts.subprocess, "run", run)
    artifacts._apt_install("maven")
    assert [c[-1] for c in commands] == ["update", "maven"]
    assert all("DPkg::Lock::Timeout=300" in command for command in commands)
