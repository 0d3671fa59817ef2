"""What a user installing the project meets first: ``outbox --version``, and a command whose
extra is not installed, which names the extra to install instead of calling itself a bug.

The missing library is simulated in-process: its import is made to fail as it does when the
extra was not installed (``tests/integration/test_wheel.py`` installs the wheel without extras
and checks the same line for real).
"""

from __future__ import annotations

import builtins
import importlib.metadata
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from typer.testing import CliRunner

from outbox_cli.main import app


def test_version_prints_the_installed_distribution_version() -> None:
    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0, result.stderr
    assert result.stdout.strip() == f"outbox-relay {importlib.metadata.version('outbox-relay')}"


@pytest.fixture
def without(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """``without("kafka")``: importing kafka (and its submodules) fails from now on, as in an
    environment where the relay extra was not installed."""
    missing: set[str] = set()
    real_import = builtins.__import__

    def fake_import(name: str, *args: Any, **kwargs: Any) -> Any:
        if name.split(".")[0] in missing:
            raise ModuleNotFoundError(f"No module named {name.split('.')[0]!r}", name=name)
        return real_import(name, *args, **kwargs)

    def hide(*names: str) -> None:
        missing.update(names)
        for loaded in list(sys.modules):
            if loaded.split(".")[0] in missing or loaded.startswith(
                ("outbox_relay", "outbox_lake", "outbox_reconcile", "outbox_stack")
            ):
                monkeypatch.delitem(sys.modules, loaded)

    monkeypatch.setattr(builtins, "__import__", fake_import)
    yield hide


@pytest.mark.parametrize(
    ("command", "library", "extra"),
    [
        (["relay", "run"], "kafka", "relay"),
        (["relay", "run"], "prometheus_client", "relay"),
        (["lake", "tables"], "deltalake", "lake"),
        (["reconcile"], "pyarrow", "lake"),
        (["lake", "query", "SELECT 1"], "duckdb", "lake"),
    ],
)
def test_a_command_without_its_extra_names_the_extra_to_install(
    without: Any, monkeypatch: pytest.MonkeyPatch, command: list[str], library: str, extra: str
) -> None:
    for name in list(__import__("os").environ):
        if name.startswith("OUTBOX_"):
            monkeypatch.delenv(name)
    without(library)
    result = CliRunner().invoke(app, command)
    assert result.exit_code == 2, (result.stdout, result.stderr)
    [line] = result.stderr.splitlines()
    assert "unexpected" not in line and "report it" not in line
    path = " ".join(word for word in command if not word.startswith(("-", "SELECT")))
    assert f"`outbox {path}`" in line
    assert f"needs the {extra} extra" in line
    assert f"pip install 'outbox-relay[{extra}]'" in line


def test_the_installation_page_shows_what_the_command_prints(
    without: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/installation.md's example of a command without its extra: the same line, the
    same exit status."""
    import re
    import shlex
    from pathlib import Path

    page = (Path(__file__).resolve().parents[2] / "docs" / "installation.md").read_text()
    shown = re.search(
        r"```text\n\$ (outbox [^\n]+)\n(error: [^\n]+)\n\$ echo \$\?\n(\d+)\n```", page
    )
    assert shown is not None, "the example block of a command without its extra"
    command, line, status = shown.groups()
    for name in list(__import__("os").environ):
        if name.startswith("OUTBOX_"):
            monkeypatch.delenv(name)
    without("kafka")
    result = CliRunner().invoke(app, shlex.split(command)[1:])
    assert (result.exit_code, result.stderr.strip()) == (int(status), line)
