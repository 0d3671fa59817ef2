"""Dependencies run one way: cli → relay, lake, connect, stack, migrations → outbox, and the
pure core (``outbox.core``) stands on the standard library alone. Checked on the source."""

from __future__ import annotations

import subprocess
import sys

from tests.sources import PACKAGES, ROOT, imports_of, module_file, modules, sources

STDLIB = set(sys.stdlib_module_names)
# The one third-party module the core may use: UUIDv7 (the standard library has it from 3.14).
CORE_ALLOWED = {"uuid_utils"}


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


def test_the_sdk_imports_kafka_only_inside_functions() -> None:
    """kafka-python is the ``relay`` extra's: importing any SDK module (outbox.consumer,
    outbox.kafka_reading...) must work without it, and load it only when a reader is built."""
    offenders = {
        f"{path.relative_to(ROOT)}: {name}"
        for path in sources("outbox")
        for name in imports_of(path, at_runtime=True, on_import=True)
        if name.split(".")[0] == "kafka"
    }
    assert not offenders, sorted(offenders)


def test_importing_the_sdk_and_the_contract_loads_no_database_kafka_or_spark_library() -> None:
    probe = (
        "import sys, outbox, outbox.core.contract, outbox.core.kafka_record, outbox_lake.records\n"
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


def _our_imports() -> dict[str, set[str]]:
    """Module → our modules it imports (at run time: inside functions too, not under
    ``if TYPE_CHECKING``), read from the source."""
    graph: dict[str, set[str]] = {}
    for package in PACKAGES:
        for name in modules(package):
            path = module_file(name)
            assert path is not None
            graph[name] = {
                found
                for found in imports_of(path, at_runtime=True)
                if module_file(found) is not None and found != name
            }
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle (its modules in order, the first again at the end), or None."""
    done: set[str] = set()
    for start in sorted(graph):
        path: list[str] = []
        on_path: set[str] = set()
        stack = [(start, iter(sorted(graph.get(start, ()))))]
        path.append(start)
        on_path.add(start)
        while stack:
            node, children = stack[-1]
            child = next(children, None)
            if child is None:
                stack.pop()
                path.pop()
                on_path.discard(node)
                done.add(node)
                continue
            if child in on_path:
                return [*path[path.index(child) :], child]
            if child not in done:
                stack.append((child, iter(sorted(graph.get(child, ())))))
                path.append(child)
                on_path.add(child)
    return None


def test_no_module_imports_itself_through_others() -> None:
    """No import cycle among our modules, lazy imports inside functions included: a cycle
    hidden by a function-level import is still two modules that cannot be read apart."""
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None
    assert _cycle(_our_imports()) is None
