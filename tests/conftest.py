"""Test plugins (fixtures live in tests/fix_*.py), and the ``integration`` marker.

Every test under ``tests/integration`` is marked ``integration`` here, whatever its module
says, so ``pytest -m "not integration"`` (``make test-unit``) runs without PostgreSQL, the
broker or Connect. The other way round holds too: a test outside ``tests/integration`` that
asks for a service fixture (one defined in a ``tests/fix_*.py`` plugin that starts or uses
the suite's services: all but the TCP proxy) fails collection with the fix to make.
"""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

# Every Spark driver the suite starts (the lake job's processes, the shared in-process session,
# the demo's job) compiles with the JVM's first tier only: a driver here lives for seconds to a
# few minutes and spends them warming up (a job's first batch takes about a third less time).
# The suite's choice, not the job's: a lake job that runs for days wants the optimizing
# compiler, and the benchmarks run without it. The variable reaches the driver's JVM through
# `spark-submit` (which PySpark starts); a value the caller set is kept.
os.environ.setdefault("SPARK_SUBMIT_OPTS", "-XX:TieredStopAtLevel=1")
# A server folder chosen for your own stack would be every test cluster's at once (each
# worker's, and the clusters tests start of their own): they choose theirs.
os.environ.pop("OUTBOX_STACK_POSTGRES_SERVER_DIR", None)
# `outbox stack up` and `outbox demo` remember the stack they started for commands run from
# other folders, in the user's state folder: the suite's stacks must not replace yours there
# (nor yours be found by a test that starts a stack of its own).
os.environ["XDG_STATE_HOME"] = tempfile.mkdtemp(prefix="outbox-test-state-")
atexit.register(shutil.rmtree, os.environ["XDG_STATE_HOME"], ignore_errors=True)

pytest_plugins = [
    "tests.fix_postgres",
    "tests.fix_stack",
    "tests.fix_cdc",
    "tests.fix_relay",
    "tests.fix_secure_kafka",
    "tests.fix_object_store",
    "tests.fix_proxy",
]

INTEGRATION = Path(__file__).resolve().parent / "integration"
# The TCP proxy starts no service of its own (it sits in front of one).
SERVICE_PLUGINS = tuple(plugin for plugin in pytest_plugins if plugin != "tests.fix_proxy")


def service_fixtures_of(item: pytest.Item) -> list[str]:
    """The service fixtures ``item`` uses (directly or through other fixtures)."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return []
    return sorted(
        name
        for name, definitions in info.name2fixturedefs.items()
        if any(getattr(d.func, "__module__", "") in SERVICE_PLUGINS for d in definitions)
    )


LONGEST_MODULES = (
    "test_lake_integrity.py",
    "test_lake.py",
    "test_lake_faults.py",
    "test_broker_faults.py",
    "test_lake_s3.py",
    "test_lake_cluster.py",
    "test_demo.py",
    "test_wheel.py",
    "test_relay_faults.py",
    "test_effects_crash.py",
    "test_kafka_security.py",
    "test_reconcile.py",
    "test_cdc_faults.py",
    "test_stack.py",
)
"""The modules that take longest, longest first (their durations in a whole run, printed at
its end): ``make test`` runs two pytest-xdist workers (``--dist loadscope``: a module runs
on one worker, its module fixtures set up once; ``--no-loadscope-reorder``: in this order,
not by their number of tests), and each worker takes the next module when it is free. The
longest first, the many short ones last, so that both workers end at about the same time."""


def _rank(item: pytest.Item) -> tuple[int, bool]:
    name = item.path.name
    longest = LONGEST_MODULES.index(name) if name in LONGEST_MODULES else len(LONGEST_MODULES)
    return (longest, not item.path.is_relative_to(INTEGRATION))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    items.sort(key=_rank)  # stable: a module's tests keep their order
    misplaced = []
    for item in items:
        if item.path.is_relative_to(INTEGRATION):
            item.add_marker(pytest.mark.integration)
        elif services := service_fixtures_of(item):
            misplaced.append(f"{item.nodeid} uses {', '.join(services)}")
    if misplaced:
        raise pytest.UsageError(
            "tests outside tests/integration must run without services "
            "(`pytest -m 'not integration'`): move these to tests/integration:\n  "
            + "\n  ".join(misplaced)
        )


@pytest.fixture(autouse=True)
def _no_log_handler_on_a_closed_stream() -> Iterator[None]:
    """A command run in this process (Typer's ``CliRunner``) points the root logger at its
    own stream, closed when the command returns: a later log line of this worker (a relay
    thread of another test) would fail to write (``--- Logging error ---``)."""
    yield
    root = logging.getLogger()
    for handler in list(root.handlers):
        stream = getattr(handler, "stream", None)
        if isinstance(handler, logging.StreamHandler) and getattr(stream, "closed", False):
            root.removeHandler(handler)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    from tests.fix_lake import stop_shared_spark

    stop_shared_spark()
