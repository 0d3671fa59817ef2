"""The README and every page of docs/ run (tests/docs_blocks.py says what each block is).

- Every Python program runs as a program against a real PostgreSQL (``OUTBOX_DATABASE_URL``
  names a migrated database), with only the extras it declares importable.
- Every block of our commands runs through the real ``outbox`` command against a migrated
  database of its own, each command exiting 0.
- The examples in the SDK's docstrings run as doctests against the same database.

Excerpts are checked against their full programs by tests/unit/test_doc_blocks.py; the named
tests run those programs.
"""

from __future__ import annotations

import doctest
import importlib
import os
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

import outbox_migrations
from outbox_stack import PostgresCluster
from outbox_stack.demo import ORDER_TYPE, WARM_UP_TYPE
from tests.docs_blocks import Block, all_blocks, import_blocker
from tests.fix_postgres import ScratchDatabase

pytestmark = pytest.mark.timeout(180)


def marked(blocks: list[Block]) -> list[object]:
    return [pytest.param(block, id=block.where) for block in blocks]


BLOCKS = all_blocks()
PROGRAMS = [b for b in BLOCKS if b.kind == "python" and not b.is_excerpt]
COMMANDS = [b for b in BLOCKS if b.kind == "shell" and not b.is_excerpt]


def test_the_pages_have_programs_and_commands() -> None:
    assert len(PROGRAMS) >= 12 and len(COMMANDS) >= 6


@pytest.fixture(scope="module")
def blockers() -> Iterator[dict[str | None, Path]]:
    """A folder per extra holding a ``sitecustomize`` that hides the other extras' libraries."""
    with tempfile.TemporaryDirectory(prefix="outbox-docs-") as folder:
        found: dict[str | None, Path] = {}
        for needs in (None, "relay", "lake", "stack"):
            path = Path(folder) / (needs or "base")
            path.mkdir()
            (path / "sitecustomize.py").write_text(import_blocker(needs))
            found[needs] = path
        yield found


def environment(url: str, blocker: Path) -> dict[str, str]:
    """The suite's environment without its OUTBOX_* settings, the database's URL, and the
    blocker first on the path (the project itself comes from the virtual environment)."""
    env = {name: value for name, value in os.environ.items() if not name.startswith("OUTBOX_")}
    return {**env, "OUTBOX_DATABASE_URL": url, "PYTHONPATH": str(blocker)}


def demo_events(database: ScratchDatabase) -> int:
    """Events of the demo's aggregate types in the outbox (no delivery path deletes them here)."""
    with database.connect() as connection:
        row = connection.execute(
            "SELECT count(*) FROM outbox.outbox WHERE aggregatetype = ANY(%s)",
            ([ORDER_TYPE, WARM_UP_TYPE],),
        ).fetchone()
    assert row is not None
    return int(row[0])


@pytest.mark.parametrize("block", marked(PROGRAMS))
def test_the_program_runs(
    block: Block, database: ScratchDatabase, blockers: dict[str | None, Path]
) -> None:
    """Twice, on the same database: a reader runs an example again, or beside the demo's
    data, and it must neither fail nor mix its rows into another example's, nor publish
    events of the demo's aggregate types (the analysts' queries read those)."""
    before = demo_events(database)
    for run in ("first", "second"):
        result = subprocess.run(
            [sys.executable, "-c", block.code],
            env=environment(database.url, blockers[block.needs]),
            cwd=tempfile.gettempdir(),  # nothing of the checkout but what PYTHONPATH gives
            capture_output=True,
            text=True,
            timeout=150,
            check=False,
        )
        assert result.returncode == 0, f"{block.where}, {run} run:\n{result.stderr[-3000:]}"
    assert demo_events(database) == before, f"{block.where} published the demo's types"


@pytest.fixture
def own_database(cluster: PostgresCluster) -> Iterator[ScratchDatabase]:
    """A migrated database for one block of commands (they may downgrade, grant, expire)."""
    database = ScratchDatabase(cluster, f"outbox_test_docs_{uuid.uuid4().hex[:10]}")
    cluster.ensure_database(database.name)
    engine = sa.create_engine(database.url)
    with engine.begin() as connection:
        outbox_migrations.upgrade(connection)
    engine.dispose()
    yield database
    cluster.drop_database(database.name)


@pytest.mark.parametrize("block", marked(COMMANDS))
def test_the_commands_run(
    block: Block, own_database: ScratchDatabase, blockers: dict[str | None, Path]
) -> None:
    outbox = Path(sys.executable).with_name("outbox")
    with own_database.connect(autocommit=True) as connection:
        for role in block.roles:
            connection.execute(f'CREATE ROLE "{role}"')
        try:
            for command in block.commands():
                result = subprocess.run(
                    [str(outbox), *command[1:]],
                    env=environment(own_database.url, blockers[block.needs]),
                    cwd=tempfile.gettempdir(),
                    capture_output=True,
                    text=True,
                    timeout=120,
                    check=False,
                )
                assert result.returncode == 0, (
                    f"{block.where}: `{' '.join(command)}` exited {result.returncode}:\n"
                    f"{result.stdout[-1500:]}\n{result.stderr[-1500:]}"
                )
        finally:
            for role in block.roles:
                connection.execute(f'DROP OWNED BY "{role}"')
                connection.execute(f'DROP ROLE "{role}"')


class _Base(DeclarativeBase):
    pass


class DocOrder(_Base):
    """The ``order`` of the docstrings' examples: a row of the application's."""

    __tablename__ = "docstring_orders"
    id: Mapped[int] = mapped_column(primary_key=True)
    total: Mapped[Decimal]


DOCSTRINGS = [("outbox", None), ("outbox.publisher", "Outbox")]


@pytest.mark.parametrize(("module", "name"), DOCSTRINGS, ids=[m for m, _ in DOCSTRINGS])
def test_the_docstring_example_runs(
    module: str, name: str | None, database: ScratchDatabase, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OUTBOX_DATABASE_URL", database.url)
    engine = sa.create_engine(database.url)
    _Base.metadata.create_all(engine)
    found = importlib.import_module(module)
    target = found if name is None else getattr(found, name)
    globs = {
        **vars(found),
        "Session": Session,
        "engine": engine,
        "order": DocOrder(total=Decimal("9.90")),
    }
    tests = doctest.DocTestFinder(recurse=False).find(target, globs=globs)
    assert tests and tests[0].examples, f"{module}.{name or ''} has no example"
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    for test in tests:
        runner.run(test)
    engine.dispose()
    assert runner.failures == 0, f"the docstring example of {module}.{name or ''} fails"
