"""Every code block of the README and docs/ says what it is (tests/docs_blocks.py), and an
excerpt is true to the full program it names, which a named test runs. No service needed:
tests/integration/test_docs.py runs the programs and commands themselves."""

from __future__ import annotations

import ast
import re
import tomllib
from xml.etree import ElementTree

import pytest

from tests.docs_blocks import EXTRAS, ROOT, Block, all_blocks, missing_from, pages

BLOCKS = all_blocks()


def marked(blocks: list[Block]) -> list[object]:
    """Blocks as parameters, named by page and line."""
    return [pytest.param(block, id=block.where) for block in blocks]


def test_every_page_but_the_lakes_is_covered() -> None:
    covered = set(pages())
    assert "README.md" in covered and "docs/application-developers.md" in covered
    assert "docs/analysts.md" not in covered, "the lake's tests run analysts.md"
    assert len(BLOCKS) > 30


@pytest.mark.parametrize("block", marked(BLOCKS))
def test_every_block_is_a_program_commands_an_excerpt_or_text(block: Block) -> None:
    assert not block.kind.startswith("unknown"), (
        f"{block.where}: ```{block.info}: use python, text, json, sql or no language (commands)"
    )
    known = ("excerpt of ", "excerpt:", "needs:", "roles:")
    for mark in block.marks:
        assert mark.startswith(known), f"{block.where}: unknown mark <!-- {mark} -->"
    if block.needs is not None:
        assert block.needs in EXTRAS, f"{block.where}: needs one of {EXTRAS}"
    if block.kind == "python" and block.is_excerpt:
        assert block.excerpt_of is not None, (
            f"{block.where}: a Python excerpt names its full program and the test running "
            "it: <!-- excerpt of PATH, run by tests/...py -->"
        )
    if block.excerpt_reason is not None:
        assert block.excerpt_reason, f"{block.where}: say why the excerpt cannot run"
    if block.kind == "shell" and not block.is_excerpt:
        for command in block.commands():
            assert command[0] == "outbox", (
                f"{block.where}: `{' '.join(command)}` is not a command of ours: mark the "
                "block <!-- excerpt: why it cannot run here -->"
            )
        assert block.commands(), f"{block.where}: an empty block"


EXCERPTS = [block for block in BLOCKS if block.excerpt_of is not None]


def test_there_are_excerpts_to_check() -> None:
    assert len(EXCERPTS) >= 4


@pytest.mark.parametrize("block", EXCERPTS, ids=[b.where for b in EXCERPTS])
def test_an_excerpt_is_true_to_its_program_which_a_test_runs(block: Block) -> None:
    assert block.excerpt_of is not None
    program, test = block.excerpt_of
    assert (ROOT / program).is_file(), f"{block.where}: no program {program}"
    assert (ROOT / test).is_file(), f"{block.where}: no test {test}"
    folder, _, stem = program.removesuffix(".py").rpartition("/")
    package = folder.rsplit("/", 1)[-1]
    runner = (ROOT / test).read_text()
    named = program in runner or folder in runner or f"{package}.{stem}" in runner
    imported = f"from {package} import" in runner and stem in runner
    assert named or imported, f"{block.where}: {test} does not run {program}"
    missing = missing_from(block.code, (ROOT / program).read_text())
    assert not missing, (
        f"{block.where}: not in {program} (in this order): {missing[:3]}: copy the excerpt "
        "from the program (pieces apart with ... lines)"
    )


def aggregate_types(code: str) -> set[str]:
    """The aggregate types a program writes as literals: the first argument (or
    ``aggregate_type=``) of each ``Event(...)`` and ``ReceivedEvent(...)`` it calls."""
    found = set()
    for node in ast.walk(ast.parse(code)):
        if not isinstance(node, ast.Call):
            continue
        name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
        if name not in ("Event", "ReceivedEvent"):
            continue
        given = [k.value for k in node.keywords if k.arg == "aggregate_type"] + node.args[:1]
        found |= {v.value for v in given if isinstance(v, ast.Constant)}
    return {value for value in found if isinstance(value, str)}


def test_aggregate_types_reads_positional_and_keyword_types() -> None:
    code = (
        "Event('a', '1', 'T', {})\n"
        "outbox.Event(aggregate_type='b', aggregate_id='1', event_type='T', payload={})\n"
        "ReceivedEvent(event_id=x, aggregate_type='c')\n"
        "Event(kind, '1', 'T', {})\n"
        "threading.Event()\n"
    )
    assert aggregate_types(code) == {"a", "b", "c"}


EXAMPLES = sorted((ROOT / "examples" / "outbox_examples").glob("*.py"))
DEMO_SERVICE = ROOT / "examples" / "outbox_examples" / "order_service.py"
"""The demo runs it (outbox_stack.demo): its events are the demo's data."""
PROGRAMS = [b for b in BLOCKS if b.kind == "python" and not b.is_excerpt]


def demo_types() -> set[str]:
    from outbox_stack.demo import ORDER_TYPE, WARM_UP_TYPE

    return {ORDER_TYPE, WARM_UP_TYPE}


def test_the_demo_publishes_what_its_order_service_publishes() -> None:
    from outbox_stack.demo import ORDER_TYPE

    assert aggregate_types(DEMO_SERVICE.read_text()) == {ORDER_TYPE}


@pytest.mark.parametrize(
    ("where", "code"),
    [pytest.param(b.where, b.code, id=b.where) for b in PROGRAMS]
    + [
        pytest.param(str(path.relative_to(ROOT)), path.read_text(), id=path.name)
        for path in EXAMPLES
        if path != DEMO_SERVICE
    ],
)
def test_no_example_writes_the_demos_aggregate_types(where: str, code: str) -> None:
    """The analysts' queries (latest state per order, sums per customer) read the demo's
    types: an example run beside the demo must not add rows to them. Each example has a
    type of its own (and its own table, and new ids each run)."""
    taken = aggregate_types(code) & demo_types()
    assert not taken, (
        f"{where} writes the demo's aggregate type(s) {sorted(taken)}: give it its own "
        "(e.g. `docs_order`), as the other examples have"
    )


def test_troubleshooting_has_a_section_for_every_error_of_ours() -> None:
    import outbox.core.errors as errors

    page = (ROOT / "docs" / "troubleshooting.md").read_text()
    headings = set(re.findall(r"^### `(\w+)`$", page, re.MULTILINE))
    missing = (set(errors.__all__) | {"OutboxError"}) - headings
    assert not missing, f"docs/troubleshooting.md has no section for {sorted(missing)}"


def pinned_versions() -> dict[str, str]:
    """What pyproject.toml and the stack's pom.xml pin, by name."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    requirements = [
        *project["dependencies"],
        *(r for extra in project["optional-dependencies"].values() for r in extra),
    ]
    found = {}
    for requirement in requirements:
        name, _, version = requirement.partition("==")
        if version:
            found[re.sub(r"\[.*\]", "", name)] = version
    pom = ElementTree.parse(ROOT / "stack" / "outbox_stack" / "java" / "pom.xml").getroot()
    namespace = {"m": pom.tag.split("}")[0].strip("{")}
    properties = pom.find("m:properties", namespace)
    assert properties is not None
    for name in (
        "kafka.version",
        "debezium.version",
        "spark.version",
        "delta.version",
        "hadoop.version",
        "aws.sdk.version",
    ):
        value = properties.find(f"m:{name}", namespace)
        assert value is not None and value.text, name
        found[name] = value.text
    found["requires-python"] = project["requires-python"]
    return found


COMPATIBILITY_ROWS = {
    # a row of docs/compatibility.md (its first cell) -> the pins it must show
    "Python": ["requires-python"],
    "SQLAlchemy": ["sqlalchemy"],
    "psycopg (3)": ["psycopg"],
    "Alembic": ["alembic"],
    "pydantic / pydantic-settings": ["pydantic", "pydantic-settings"],
    "Typer": ["typer"],
    "uuid-utils": ["uuid-utils"],
    "Apache Kafka (broker)": ["kafka.version"],
    "Kafka Connect": ["kafka.version"],
    "Debezium": ["debezium.version"],
    "kafka-python": ["kafka-python"],
    "PySpark": ["pyspark"],
    "Spark (jars)": ["spark.version"],
    "Delta Lake (jars)": ["delta.version"],
    "hadoop-aws (S3A)": ["hadoop.version"],
    "AWS SDK for Java v2": ["aws.sdk.version"],
    "deltalake (delta-rs)": ["deltalake"],
    "pyarrow / pandas / DuckDB": ["pyarrow", "pandas", "duckdb"],
}


def test_the_compatibility_page_shows_the_pinned_versions() -> None:
    pins = pinned_versions()
    rows = {
        cells[0]: cells[1]
        for line in (ROOT / "docs" / "compatibility.md").read_text().splitlines()
        if line.startswith("| ")
        and len(cells := [c.strip() for c in line.strip("|").split("|")]) > 1
    }
    wrong = {}
    for row, names in COMPATIBILITY_ROWS.items():
        version = (
            pins["requires-python"].removeprefix(">=") if names == ["requires-python"] else None
        )
        wanted = [version] if version else [pins[name] for name in names]
        if row not in rows or not all(v in rows[row] for v in wanted):
            wrong[row] = (rows.get(row), wanted)
    assert not wrong, f"docs/compatibility.md disagrees with the pins: {wrong}"


@pytest.mark.parametrize("page", [p for p in pages() if p != "docs/benchmarks.md"])
def test_user_docs_do_not_speak_of_this_machine(page: str) -> None:
    """A reader's machine is not the one the docs were written on: say which machine (the
    benchmarks', CI's) or leave it out. docs/benchmarks.md names its machine at the top."""
    text = " ".join((ROOT / page).read_text().split())
    found = re.findall(
        r"[^.]*\b(?:this (?:[\w-]+ )?machine|measured here|here on)\b[^.]*", text, re.I
    )
    assert not found, f"{page}: {found}"
