"""The built wheel, installed as users install it: in a fresh virtual environment outside the
checkout, with the extras ``relay``, ``lake``, ``stack``, ``tracing`` and ``console``, run
from a folder where nothing of the checkout can be imported.

It holds ``outbox`` and the ``outbox_*`` packages only (generic names such as ``cli`` or
``stack`` would collide with other projects in site-packages), with their data: the
migration scripts, the connector file, the lake job's log4j2 settings. Downloads come from
the shared pip cache (.cache/pip), so the install takes about a minute.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest
from alembic.script import ScriptDirectory

from outbox_migrations import SCRIPT_LOCATION, VERSION_TABLE
from tests.docs_blocks import blocks
from tests.fix_postgres import ScratchDatabase
from tests.sources import PACKAGES, ROOT, libraries, modules

pytestmark = pytest.mark.timeout(600)

EXTRAS = "relay,lake,stack,tracing,console"
DISTRIBUTION = "outbox-relay"
PROJECT_VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
# What setuptools needs to build the wheel: the project file, its readme, the package folders.
BUILD_INPUTS = [
    "pyproject.toml",
    "README.md",
    *sorted({f.split("/")[0] for f in PACKAGES.values()}),
]


class Installed:
    """A virtual environment with the wheel installed, and a folder outside the checkout."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.venv = root / "venv"
        self.elsewhere = root / "elsewhere"
        self.elsewhere.mkdir()
        self.env = {
            name: value
            for name, value in os.environ.items()
            if name not in {"PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME"}
            and not name.startswith("OUTBOX_")
        }
        self.env["PIP_CACHE_DIR"] = str(ROOT / ".cache" / "pip")
        self.env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"

    def run(
        self, *command: str | Path, timeout: float = 120, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [str(part) for part in command],
            cwd=self.elsewhere,
            env={**self.env, **(env or {})},
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        assert result.returncode == 0, (
            f"{' '.join(map(str, command))} exited {result.returncode}:\n"
            f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
        )
        return result

    def python(self, code: str, **kwargs: object) -> str:
        return self.run(self.venv / "bin" / "python", "-c", code, **kwargs).stdout  # type: ignore[arg-type]


def build_wheel(into: Path, installed: Installed) -> Path:
    """``pip wheel --no-deps`` of a copy of the build inputs (the checkout stays untouched:
    no build/ or egg-info left in it)."""
    source = into / "source"
    for name in BUILD_INPUTS:
        if (ROOT / name).is_dir():
            shutil.copytree(
                ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__")
            )
        else:
            source.mkdir(exist_ok=True)
            shutil.copy2(ROOT / name, source / name)
    wheels = into / "wheels"
    installed.run(
        sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", wheels, source, timeout=240
    )
    (wheel,) = wheels.glob("*.whl")
    return wheel


@pytest.fixture(scope="module")
def wheel() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="outbox-wheel-build-") as folder:
        yield build_wheel(Path(folder), Installed(Path(folder)))


def install(wheel: Path, extras: str | None) -> Iterator[Installed]:
    """The wheel (with ``extras``; None: the base only) in a fresh virtual environment."""
    with tempfile.TemporaryDirectory(prefix="outbox-wheel-") as folder:
        root = Path(folder)
        assert not root.is_relative_to(ROOT)
        installed = Installed(root)
        started = time.monotonic()
        installed.run(sys.executable, "-m", "venv", installed.venv, timeout=120)
        requirement = f"{wheel}[{extras}]" if extras else str(wheel)
        installed.run(
            installed.venv / "bin" / "python",
            "-m",
            "pip",
            "install",
            "-q",
            requirement,
            timeout=420,
        )
        print(f"wheel ({extras or 'no extra'}) installed in {time.monotonic() - started:.0f} s")
        yield installed


@pytest.fixture(scope="module")
def installed(wheel: Path) -> Iterator[Installed]:
    yield from install(wheel, EXTRAS)


@pytest.fixture(scope="module")
def installed_base(wheel: Path) -> Iterator[Installed]:
    """The wheel without any extra: what docs/quickstart.md installs for the SDK alone."""
    yield from install(wheel, None)


def test_the_command_runs_from_anywhere(installed: Installed) -> None:
    result = installed.run(installed.venv / "bin" / "outbox", "--help")
    for command in ("db", "stack", "connect", "relay", "lake", "reconcile", "demo"):
        assert command in result.stdout


def test_db_upgrade_creates_the_version_table(
    installed: Installed, empty_database: ScratchDatabase
) -> None:
    installed.run(
        installed.venv / "bin" / "outbox",
        "db",
        "upgrade",
        env={"OUTBOX_DATABASE_URL": empty_database.url},
    )
    with empty_database.connect() as connection:
        row = connection.execute(
            "SELECT to_regclass(%s)::text", (f"outbox.{VERSION_TABLE}",)
        ).fetchone()
        assert row is not None and row[0] == f"outbox.{VERSION_TABLE}"
        versions = connection.execute(f"SELECT version_num FROM outbox.{VERSION_TABLE}")
        head = ScriptDirectory(str(SCRIPT_LOCATION)).get_current_head()
        assert [version for (version,) in versions] == [head]


def test_every_module_imports_from_the_installed_wheel(installed: Installed) -> None:
    """Every module of the wheel, and every library they import inside functions too (the
    extras installed them)."""
    names = [name for package in PACKAGES for name in modules(package)] + sorted(libraries())
    found = json.loads(
        installed.python(
            "import importlib, json, sys\n"
            f"names = {names!r}\n"
            # a namespace package (opentelemetry) has no __file__: where its first part is
            "def where(m): return m.__file__ or next(iter(m.__path__))\n"
            "print(json.dumps({n: where(importlib.import_module(n)) for n in names}))\n"
        )
    )
    site = installed.venv / "lib"
    outside = {name: file for name, file in found.items() if not Path(file).is_relative_to(site)}
    assert not outside, f"imported from elsewhere than the virtual environment: {outside}"


def test_the_package_data_is_installed(installed: Installed) -> None:
    answer = installed.python(
        "from outbox import OutboxSettings\n"
        "from outbox_connect import ConnectorSettings, render_connector_config\n"
        "from outbox_lake import session\n"
        "import outbox_migrations\n"
        "config = render_connector_config(ConnectorSettings(), OutboxSettings())\n"
        "print(config['connector.class'])\n"
        "print(session._LOG4J2.is_file())\n"
        "print((outbox_migrations.SCRIPT_LOCATION / 'script.py.mako').is_file())\n"
    )
    assert answer.split() == ["io.debezium.connector.postgresql.PostgresConnector", "True", "True"]


def test_the_wheel_installs_only_outbox_and_outbox_packages(installed: Installed) -> None:
    shown = installed.run(
        installed.venv / "bin" / "python", "-m", "pip", "show", "-f", DISTRIBUTION
    ).stdout
    files = shown.split("Files:", 1)[1].split()
    assert files
    tops = {file.split("/")[0] for file in files if not file.startswith("../")}
    unexpected = {
        top
        for top in tops
        if top != "outbox" and not top.startswith("outbox_") and not top.endswith(".dist-info")
    }
    assert not unexpected, sorted(unexpected)
    assert tops >= set(PACKAGES)
    scripts = [file for file in files if file.startswith("../")]
    assert [Path(file).name for file in scripts] == ["outbox"], scripts


def test_the_base_install_prints_its_version_and_names_a_missing_extra(
    installed_base: Installed,
) -> None:
    outbox = installed_base.venv / "bin" / "outbox"
    version = installed_base.run(outbox, "--version").stdout
    assert version.strip() == f"{DISTRIBUTION} {PROJECT_VERSION}"
    result = subprocess.run(
        [str(outbox), "relay", "run"],
        cwd=installed_base.elsewhere,
        env={**installed_base.env, "OUTBOX_DATABASE_URL": "postgresql://u@127.0.0.1:1/x"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2, result.stderr
    assert result.stderr.splitlines() == [
        "error: `outbox relay run` needs the relay extra (prometheus_client is not "
        "installed): pip install 'outbox-relay[relay]' (from a clone: pip install -e "
        "'.[relay]')"
    ]


def test_the_quickstart_runs_on_the_base_install(
    installed_base: Installed, empty_database: ScratchDatabase
) -> None:
    """docs/quickstart.md, step by step, with the wheel alone: migrate with the CLI, then
    its program (the SDK needs no extra)."""
    env = {"OUTBOX_DATABASE_URL": empty_database.url}
    installed_base.run(installed_base.venv / "bin" / "outbox", "db", "upgrade", env=env)
    program = next(block.code for block in blocks("docs/quickstart.md") if block.kind == "python")
    printed = installed_base.python(program, env=env)
    assert "is in the outbox, committed with the order; position" in printed
