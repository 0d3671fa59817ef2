"""The packages the wheel installs, the folders that hold them, and what their sources import.

Each required folder holds one prefixed package (relay/outbox_relay/, as psycopg keeps
psycopg_pool/psycopg_pool/). Imports are read from the source with ``ast``: nothing is
imported, so the layering and extras checks run without the services or the heavy libraries.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {
    "outbox": "outbox",
    "outbox_cli": "cli/outbox_cli",
    "outbox_connect": "connect/outbox_connect",
    "outbox_console": "console/outbox_console",
    "outbox_examples": "examples/outbox_examples",
    "outbox_lake": "lake/outbox_lake",
    "outbox_migrations": "migrations/outbox_migrations",
    "outbox_reconcile": "reconcile/outbox_reconcile",
    "outbox_relay": "relay/outbox_relay",
    "outbox_stack": "stack/outbox_stack",
}


def sources(folder: str) -> list[Path]:
    """The Python files under ``folder`` (relative to the checkout)."""
    return sorted((ROOT / folder).rglob("*.py")) if (ROOT / folder).is_dir() else []


def _type_checking_only(node: ast.If) -> bool:
    return isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"


def imports_of(path: Path, *, at_runtime: bool = False, on_import: bool = False) -> set[str]:
    """Every absolute import of ``path`` (inside functions too), as module names; with
    ``at_runtime``, not those under ``if TYPE_CHECKING:``; with ``on_import``, only those that
    importing the module runs (none inside a function)."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if at_runtime and isinstance(node, ast.If) and _type_checking_only(node):
            for child in node.orelse:
                visit(child)
            return
        if on_import and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            return
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            # `from package import module` imports the module too
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text(), filename=str(path)))
    return found


def module_file(name: str) -> Path | None:
    """The source of our module ``name`` (``outbox_relay.settings``), None if not ours or
    not a module (``from outbox import Event`` names an attribute)."""
    top, *rest = name.split(".")
    if top not in PACKAGES:
        return None
    base = ROOT / PACKAGES[top] / Path(*rest) if rest else ROOT / PACKAGES[top]
    for candidate in (base / "__init__.py", base.with_suffix(".py")):
        if candidate.is_file():
            return candidate
    return None


def modules(package: str) -> list[str]:
    """The dotted names of every module of ``package`` (Alembic's version scripts, which are
    not modules of the package, left out)."""
    folder = ROOT / PACKAGES[package]
    found = []
    for path in sources(PACKAGES[package]):
        if not (path.parent / "__init__.py").is_file():
            continue
        parts = path.relative_to(folder).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found.append(".".join((package, *parts)))
    return sorted(found)


def libraries() -> set[str]:
    """The top-level names of every library the wheel's modules import (lazily too)."""
    return (
        {
            name.split(".")[0]
            for folder in PACKAGES.values()
            for path in sources(folder)
            for name in imports_of(path, at_runtime=True)
        }
        - set(sys.stdlib_module_names)
        - {"__future__"}
        - set(PACKAGES)
    )
