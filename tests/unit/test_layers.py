"""Dependencies run one way: cli → relay, lake, connect, stack, migrations → outbox, and the
pure core (``outbox.core``) stands on the standard library alone. Checked on the source."""

from __future__ import annotations

import subprocess
import sys

from tests.sources import PACKAGES, ROOT, imports_of, sources

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
