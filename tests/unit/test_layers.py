"""Dependencies run one way: cli → relay, lake, connect, stack, migrations → outbox, and the
pure core (``outbox.core``) stands on the standard library alone. Checked on the source."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Each package and the folder that holds it (relay/outbox_relay/, as psycopg_pool/psycopg_pool/).
PACKAGES = {
    "outbox": "outbox",
    "outbox_cli": "cli/outbox_cli",
    "outbox_relay": "relay/outbox_relay",
    "outbox_lake": "lake/outbox_lake",
    "outbox_connect": "connect/outbox_connect",
    "outbox_stack": "stack/outbox_stack",
    "outbox_migrations": "migrations/outbox_migrations",
    "outbox_reconcile": "reconcile/outbox_reconcile",
}
STDLIB = set(sys.stdlib_module_names)
# The one third-party module the core may use: UUIDv7 (the standard library has it from 3.14).
CORE_ALLOWED = {"uuid_utils"}


def imports_of(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def sources(folder: str) -> list[Path]:
    return sorted((ROOT / folder).rglob("*.py")) if (ROOT / folder).is_dir() else []


def test_the_core_imports_only_the_standard_library_and_itself() -> None:
    offenders = {
        f"{path.relative_to(ROOT)}: {name}"
        for path in sources("outbox/core")
        for name in imports_of(path)
        if name.split(".")[0] not in STDLIB | CORE_ALLOWED and not name.startswith("outbox.core")
    }
    assert not offenders, sorted(offenders)


def test_nothing_imports_the_cli_and_the_sdk_imports_no_floor_above_it() -> None:
    above_sdk = set(PACKAGES) - {"outbox"}
    offenders = set()
    for package, folder in PACKAGES.items():
        for path in sources(folder):
            for name in imports_of(path):
                top = name.split(".")[0]
                if top == "outbox_cli" and package != "outbox_cli":
                    offenders.add(f"{path.relative_to(ROOT)} imports {name}")
                if package == "outbox" and top in above_sdk:
                    offenders.add(f"{path.relative_to(ROOT)} imports {name}")
    assert not offenders, sorted(offenders)


def test_importing_the_sdk_and_the_contract_loads_no_database_kafka_or_spark_library() -> None:
    probe = (
        "import sys, outbox, outbox.core.contract, outbox_lake.records\n"
        "heavy = ('sqlalchemy', 'psycopg', 'pydantic_settings', 'kafka', 'pyspark', 'deltalake')\n"
        "print(','.join(m for m in heavy if m in sys.modules))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == ""
    used = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, outbox; outbox.Outbox; print('sqlalchemy' in sys.modules)",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    assert used.stdout.strip() == "True"  # the adapter loads on first use
