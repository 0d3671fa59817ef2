"""Every extra installs what its modules import: the base dependencies what every module
needs, ``relay``, ``lake`` and ``stack`` what theirs need, through the packages of ours they
import too (``outbox lake ingest`` logs with outbox_relay.logs: python-json-logger).

Checked on the source against pyproject.toml and the requirements of the distributions the
dev environment holds (what pip would install with the extra); tests/integration/test_wheel.py
installs the built wheel with its extras for real.
"""

from __future__ import annotations

import importlib.metadata
import re
import sys
import tomllib
from collections.abc import Iterable
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from tests.sources import PACKAGES, ROOT, imports_of, module_file, sources

PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
# Which extra each part needs; every other module of the wheel needs the base only.
EXTRA_OF = {
    "outbox/consumer.py": "relay",
    # optional: imported only where the API is installed (ImportError: no spans)
    "outbox/tracing.py": "tracing",
    "outbox/kafka_reading.py": "relay",
    "outbox/kafka_clients.py": "relay",
    "outbox/kafka_login.py": "relay",
    "outbox/_lenient_records.py": "relay",
    "outbox/effect_metrics.py": "relay",
    "outbox/consumer_dead_letters.py": "relay",
    "examples/outbox_examples/shipping_service.py": "relay",
    "examples/outbox_examples/payment_effects.py": "relay",
    "relay/outbox_relay": "relay",
    "cli/outbox_cli/relay.py": "relay",
    "connect/outbox_connect/open_transactions.py": "relay",
    "cli/outbox_cli/connect.py": "relay",
    "lake/outbox_lake": "lake",
    "reconcile/outbox_reconcile": "lake",
    "cli/outbox_cli/lake.py": "lake",
    "cli/outbox_cli/reconcile.py": "lake",
    "stack/outbox_stack": "stack",
    "cli/outbox_cli/stack.py": "stack",
    "cli/outbox_cli/demo.py": "stack",
    "console/outbox_console": "console",
    "cli/outbox_cli/console.py": "console",
}
STDLIB = set(sys.stdlib_module_names) | {"__future__"}


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def installed_with(extra: str | None) -> set[str]:
    """The distributions pip installs for the project with ``extra`` (None: the base)."""
    wanted: list[Requirement] = [Requirement(text) for text in PROJECT["dependencies"]]
    if extra is not None:
        wanted += [Requirement(text) for text in PROJECT["optional-dependencies"][extra]]
    found: set[str] = set()
    while wanted:
        requirement = wanted.pop()
        name = normalized(requirement.name)
        if name == normalized(PROJECT["name"]):  # the project's own extras
            for own in requirement.extras:
                wanted += [Requirement(t) for t in PROJECT["optional-dependencies"][own]]
            continue
        if name in found:
            continue
        found.add(name)
        for text in importlib.metadata.requires(requirement.name) or []:
            dependency = Requirement(text)
            extras = requirement.extras or {""}
            if dependency.marker is None or any(
                dependency.marker.evaluate({"extra": e}) for e in extras
            ):
                wanted.append(dependency)
    return found


def providers() -> dict[str, set[str]]:
    """Top-level import name -> the distributions that provide it."""
    return {
        name: {normalized(d) for d in dists}
        for name, dists in importlib.metadata.packages_distributions().items()
    }


def third_party_imports(start: Iterable[Path], extra: str | None) -> dict[str, Path]:
    """Top-level names of the libraries ``start`` imports at run time, directly or through our
    modules it imports (and their packages' ``__init__``), each with a file importing it.
    Of a module that belongs to another extra, only what importing it runs counts (``outbox
    --help`` imports every command's module; only running ``outbox lake`` needs the lake)."""
    found: dict[str, Path] = {}
    seen: set[Path] = set()
    todo = list(start)
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        on_import = extra_of(path) != extra
        for name in imports_of(path, at_runtime=True, on_import=on_import):
            top = name.split(".")[0]
            if top in PACKAGES:
                parts = name.split(".")
                todo += [
                    file
                    for i in range(1, len(parts) + 1)
                    if (file := module_file(".".join(parts[:i]))) is not None
                ]
            elif top not in STDLIB:
                found.setdefault(top, path)
    return found


def extra_of(path: Path) -> str | None:
    relative = path.relative_to(ROOT).as_posix()
    for part, extra in EXTRA_OF.items():
        if relative == part or relative.startswith(part + "/"):
            return extra
    return None


def wheel_sources() -> list[Path]:
    return [path for folder in PACKAGES.values() for path in sources(folder)]


def test_every_part_named_here_exists() -> None:
    assert all((ROOT / part).exists() for part in EXTRA_OF), EXTRA_OF


@pytest.mark.parametrize("extra", [None, "relay", "lake", "stack", "tracing", "console"])
def test_the_extra_installs_what_its_modules_import(extra: str | None) -> None:
    installed = installed_with(extra)
    provided_by = providers()
    files = [path for path in wheel_sources() if extra_of(path) == extra]
    assert files
    missing = {
        f"{path.relative_to(ROOT)} imports {name}"
        for name, path in third_party_imports(files, extra).items()
        if not provided_by.get(name, set()) & installed
    }
    assert not missing, f"add to the {extra or 'base'} dependencies: {sorted(missing)}"


def test_the_relay_extra_gives_kafka_python_its_c_checksum() -> None:
    """kafka-python computes each record batch's CRC-32C (produce) and checks it (fetch) in
    pure Python unless the ``crc32c`` package is there: a third of the relay's time, and the
    lake's reads pay it too. The relay extra installs it; this environment must have it."""
    from kafka.record import util

    assert "crc32c" in installed_with("relay")
    assert util.calc_crc32c.__defaults__ is not None
    assert util.calc_crc32c.__defaults__[0] is not util.crc32c_py, (
        "kafka-python falls back to its pure-Python CRC-32C: install the relay extra"
    )


def test_the_cli_names_the_smallest_extra_of_every_library_an_extra_adds() -> None:
    """A command whose extra is missing names it (``outbox_cli._common.EXTRA_OF_LIBRARY``):
    every library the extras' modules import and the base does not install is there, with the
    smallest extra that installs it."""
    from outbox_cli._common import EXTRA_OF_LIBRARY

    order: list[str | None] = [None, "relay", "lake", "stack", "console"]
    provided_by = providers()
    wrong = []
    for extra in order[1:]:
        files = [path for path in wheel_sources() if extra_of(path) == extra]
        for name, path in third_party_imports(files, extra).items():
            dists = provided_by.get(name, set())
            smallest = next(e for e in order if dists & installed_with(e))
            if smallest is not None and EXTRA_OF_LIBRARY.get(name) != smallest:
                wrong.append(f"{name} ({path.relative_to(ROOT)}): {smallest}")
    assert not wrong, f"EXTRA_OF_LIBRARY should name: {wrong}"
    for name, extra in EXTRA_OF_LIBRARY.items():
        dists = provided_by.get(name, set())
        assert dists, f"{name}: no installed distribution provides it"
        smallest = next(e for e in order if dists & installed_with(e))
        assert smallest == extra, f"EXTRA_OF_LIBRARY[{name!r}] should be {smallest}"


def test_the_installation_page_names_the_extra_of_every_command() -> None:
    """docs/installation.md's table of commands: each top-level command of `outbox`, with the
    extra its module needs (as EXTRA_OF says, which the tests above check)."""
    import typer.main

    from outbox_cli.main import app

    command = typer.main.get_command(app)
    names = set(getattr(command, "commands", {}))
    module_of = {"reconcile": "reconcile", "trace": "reconcile"}
    expected = {
        name: extra_of(ROOT / "cli" / "outbox_cli" / f"{module_of.get(name, name)}.py") or "none"
        for name in names
    }
    page = (ROOT / "docs" / "installation.md").read_text()
    table = page.split("## Commands and the extra each needs", 1)[1].split("\n\n")[1]
    documented: dict[str, str] = {}
    for line in table.splitlines()[2:]:
        first, extra = (cell.strip() for cell in line.strip("|").split("|")[:2])
        for name in re.findall(r"`outbox ([a-z-]+)", first):
            documented[name] = extra.split()[0].strip("`")
    documented.pop("--help", None)
    documented.pop("--version", None)
    assert documented == expected
