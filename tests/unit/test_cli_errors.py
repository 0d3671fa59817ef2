"""Every ``outbox`` command meets a bad setting or an unreachable service with one readable
line on stderr and exit status 2, no traceback; with ``--verbose`` the traceback comes too.

No service is needed: the "unreachable" database is a closed loopback port. The commands run
in-process through Typer's runner (the same ``app`` the console script runs).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from outbox_cli._common import friendly_errors, show_tracebacks
from outbox_cli.main import app

CLOSED = 1  # tcpmux: nothing listens on port 1 of loopback (a port drawn at collection time
# could be another worker's service by the time these tests run)
NO_DATABASE = {"OUTBOX_DATABASE_URL": f"postgresql+psycopg://u:s3cret-pw@127.0.0.1:{CLOSED}/x"}
BAD_STACK = {"OUTBOX_STACK_POSTGRES_PORT": "80"}
BAD_CONNECT = {"OUTBOX_CONNECT_URL": "ftp://connect"}
BAD_KAFKA = {"OUTBOX_KAFKA_BOOTSTRAP_SERVERS": "no-port-here"}
BAD_LAKE = {"OUTBOX_LAKE_MAX_RECORDS_PER_BATCH": "0"}
EVENT = "0190c5a8-9c1e-7000-8000-000000000000"

UNREACHABLE_DATABASE = "Connection refused"
CASES: list[tuple[list[str], dict[str, str], str]] = [
    (["stack", "up"], BAD_STACK, "OUTBOX_STACK_POSTGRES_PORT"),
    (["stack", "down"], BAD_STACK, "OUTBOX_STACK_POSTGRES_PORT"),
    (["stack", "status"], BAD_STACK, "OUTBOX_STACK_POSTGRES_PORT"),
    (["stack", "logs"], BAD_STACK, "OUTBOX_STACK_POSTGRES_PORT"),
    (["stack", "env"], BAD_STACK, "OUTBOX_STACK_POSTGRES_PORT"),
    (["stack", "destroy", "--yes"], BAD_STACK, "OUTBOX_STACK_POSTGRES_PORT"),
    (["db", "upgrade"], NO_DATABASE, UNREACHABLE_DATABASE),
    (["db", "downgrade", "base"], NO_DATABASE, UNREACHABLE_DATABASE),
    (["db", "current"], NO_DATABASE, UNREACHABLE_DATABASE),
    (["db", "expire"], NO_DATABASE, UNREACHABLE_DATABASE),
    (
        ["db", "grant", "app", "--publisher", "--aggregate-type", "order"],
        NO_DATABASE,
        UNREACHABLE_DATABASE,
    ),
    (["db", "grant", "app", "--publisher"], NO_DATABASE, "--aggregate-type T"),
    (["db", "revoke", "app", "--aggregate-type", "order"], NO_DATABASE, UNREACHABLE_DATABASE),
    (["db", "register-types", "order"], NO_DATABASE, UNREACHABLE_DATABASE),
    (["db", "register-types", "--from-kafka"], BAD_KAFKA, "OUTBOX_KAFKA_BOOTSTRAP_SERVERS"),
    (
        ["db", "cdc-role"],
        {**NO_DATABASE, "OUTBOX_CONNECT_DATABASE_PASSWORD": "x"},
        UNREACHABLE_DATABASE,
    ),
    (
        ["db", "relay-role"],
        {**NO_DATABASE, "OUTBOX_RELAY_DATABASE_PASSWORD": "x"},
        UNREACHABLE_DATABASE,
    ),
    (["db", "current"], {"OUTBOX_SCHEMA_NAME": "x;y", **NO_DATABASE}, "OUTBOX_SCHEMA_NAME"),
    # SQLAlchemy reads postgresql:// as psycopg2 (not installed): the setting means psycopg 3.
    (
        ["db", "current"],
        {"OUTBOX_DATABASE_URL": f"postgresql://u:s3cret-pw@127.0.0.1:{CLOSED}/x"},
        UNREACHABLE_DATABASE,
    ),
    (
        ["db", "current", "--database-url", f"postgresql://u@127.0.0.1:{CLOSED}/x"],
        {},
        UNREACHABLE_DATABASE,
    ),
    (["connect", "apply"], BAD_CONNECT, "OUTBOX_CONNECT_URL"),
    (["connect", "status"], BAD_CONNECT, "OUTBOX_CONNECT_URL"),
    (["connect", "status"], {"OUTBOX_CONNECT_URL": f"http://127.0.0.1:{CLOSED}"}, "reached"),
    (["connect", "restart"], BAD_CONNECT, "OUTBOX_CONNECT_URL"),
    (["connect", "unblock"], {"OUTBOX_CONNECT_OFFSETS_TOPIC": "a b"}, "OFFSETS_TOPIC"),
    (["connect", "unblock"], BAD_KAFKA, "OUTBOX_KAFKA_BOOTSTRAP_SERVERS"),
    (["relay", "run"], {**NO_DATABASE, **BAD_KAFKA}, "OUTBOX_KAFKA_BOOTSTRAP_SERVERS"),
    (["relay", "health"], {"OUTBOX_RELAY_HTTP_PORT": "port"}, "OUTBOX_RELAY_HTTP_PORT"),
    (["relay", "dead-letters", "list"], NO_DATABASE, UNREACHABLE_DATABASE),
    (["relay", "dead-letters", "retry", "--all"], NO_DATABASE, UNREACHABLE_DATABASE),
    (["relay", "dead-letters", "discard", EVENT, "--yes"], NO_DATABASE, UNREACHABLE_DATABASE),
    (["lake", "ingest"], BAD_KAFKA, "OUTBOX_KAFKA_BOOTSTRAP_SERVERS"),
    (["lake", "ingest"], BAD_LAKE, "OUTBOX_LAKE_MAX_RECORDS_PER_BATCH"),
    (["lake", "tables"], BAD_LAKE, "OUTBOX_LAKE_MAX_RECORDS_PER_BATCH"),
    (["lake", "query", "SELECT 1"], BAD_LAKE, "OUTBOX_LAKE_MAX_RECORDS_PER_BATCH"),
    (["lake", "maintain"], BAD_LAKE, "OUTBOX_LAKE_MAX_RECORDS_PER_BATCH"),
    (["lake", "packages", "--jars"], BAD_STACK, "OUTBOX_STACK_POSTGRES_PORT"),
    (["consumer", "dead-letters", "list"], NO_DATABASE, UNREACHABLE_DATABASE),
    (
        ["consumer", "dead-letters", "list"],
        {"OUTBOX_SCHEMA_NAME": "x;y", **NO_DATABASE},
        "SCHEMA_NAME",
    ),
    (["consumer", "dead-letters", "show", "c", "t", "0", "1"], NO_DATABASE, UNREACHABLE_DATABASE),
    (["consumer", "dead-letters", "replay", "c", "--all"], NO_DATABASE, UNREACHABLE_DATABASE),
    (
        ["consumer", "dead-letters", "replay", "c", "t", "0", "1"],
        {**NO_DATABASE, **BAD_KAFKA},
        "OUTBOX_KAFKA_BOOTSTRAP_SERVERS",
    ),
    (
        ["consumer", "dead-letters", "discard", "c", "--all", "--yes"],
        NO_DATABASE,
        UNREACHABLE_DATABASE,
    ),
    (["effects", "list"], NO_DATABASE, UNREACHABLE_DATABASE),
    (["effects", "mark-done", "payments", EVENT, "charge"], NO_DATABASE, UNREACHABLE_DATABASE),
    (["effects", "release", "payments", EVENT, "charge"], NO_DATABASE, UNREACHABLE_DATABASE),
    (["demo"], BAD_STACK, "OUTBOX_STACK_POSTGRES_PORT"),
    (["console"], {"OUTBOX_CONSOLE_HOST": "0.0.0.0"}, "OUTBOX_CONSOLE_TOKEN_FILE"),
    (
        ["console"],
        {"OUTBOX_CONSOLE_TOKEN_FILE": "/nonexistent/console.token"},
        "OUTBOX_CONSOLE_TOKEN_FILE",
    ),
    (["reconcile"], {"OUTBOX_RECONCILE_EXAMPLES": "-1"}, "OUTBOX_RECONCILE_EXAMPLES"),
    (["reconcile", "--quiet"], NO_DATABASE, UNREACHABLE_DATABASE),
    (["trace", EVENT], NO_DATABASE, UNREACHABLE_DATABASE),
]


@pytest.fixture
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No OUTBOX_* setting of the shell or of the suite leaks into a case."""
    import os

    for name in list(os.environ):
        if name.startswith("OUTBOX_"):
            monkeypatch.delenv(name)
    yield


def _ids(case: tuple[list[str], dict[str, str], str]) -> str:
    return " ".join(case[0][:3]) + " / " + case[2]


@pytest.mark.parametrize("case", CASES, ids=[_ids(case) for case in CASES])
@pytest.mark.usefixtures("clean_environment")
def test_every_command_explains_a_bad_setting_or_a_down_service_in_one_line(
    case: tuple[list[str], dict[str, str], str],
) -> None:
    args, env, named = case
    result = CliRunner().invoke(app, args, env=env)
    assert result.exit_code == 2, (result.stdout, result.stderr)
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert named in lines[0]
    assert "Traceback" not in result.stderr + result.stdout
    assert "s3cret-pw" not in result.stderr + result.stdout

    verbose = CliRunner().invoke(app, [*args, "--verbose"], env=env)
    assert verbose.exit_code == 2, (verbose.stdout, verbose.stderr)
    assert "Traceback (most recent call last)" in verbose.stderr
    assert verbose.stderr.splitlines()[-1] == lines[0]  # the same line closes it


def test_every_command_is_covered_by_the_cases() -> None:
    """A new command gets a case here (its bad setting, its exit status)."""
    import typer.main

    def leaves(command: object, prefix: tuple[str, ...]) -> set[tuple[str, ...]]:
        children = getattr(command, "commands", None)
        if not children:
            return {prefix}
        found: set[tuple[str, ...]] = set()
        for name, child in children.items():
            found |= leaves(child, (*prefix, name))
        return found

    commands = leaves(typer.main.get_command(app), ())
    assert len(commands) > 20
    missing = {c for c in commands if not any(tuple(a[: len(c)]) == c for a, _, _ in CASES)}
    assert not missing, sorted(missing)


def test_an_unexpected_error_says_so_in_one_line_and_exits_1() -> None:
    def broken() -> None:
        with friendly_errors():
            raise RuntimeError("a bug")

    show_tracebacks(False)  # as a command without --verbose starts
    bug = typer.Typer()
    bug.command()(broken)
    result = CliRunner().invoke(bug, [])
    assert result.exit_code == 1
    assert result.stderr.splitlines() == [
        "unexpected error: RuntimeError: a bug (run the command again with --verbose for the "
        "traceback, and report it)"
    ]


def test_a_long_message_is_cut_to_one_line_and_the_command_exits_2() -> None:
    from outbox.core.errors import StackError

    def failing() -> None:
        with friendly_errors():
            raise StackError("the job stopped; see job.log:\n" + "a log line\n" * 200)

    show_tracebacks(False)
    command = typer.Typer()
    command.command()(failing)
    result = CliRunner().invoke(command, [])
    assert result.exit_code == 2
    [line] = result.stderr.splitlines()
    assert line.startswith("error: the job stopped; see job.log: a log line a log line")
    assert line.endswith("(--verbose shows it all)") and len(line) <= 600


PASSWORD_URLS = [
    f"postgresql+psycopg://u:s3cret-pw@127.0.0.1:{CLOSED}/x",
    f"postgresql+psycopg://u@127.0.0.1:{CLOSED}/x?password=s3cret-pw",
]


@pytest.mark.parametrize("url", PASSWORD_URLS, ids=["in the authority", "in the query"])
@pytest.mark.parametrize(
    "command", [["db", "current"], ["db", "expire"], ["effects", "list"]], ids=" ".join
)
@pytest.mark.usefixtures("clean_environment")
def test_a_password_on_the_command_line_is_refused_with_the_fix(
    command: list[str], url: str
) -> None:
    """Every user of the machine can read a process's arguments (``ps``): a URL with its
    password there is refused before anything connects, and the line says what to use."""
    result = CliRunner().invoke(app, [*command, "--database-url", url])
    assert result.exit_code == 2, (result.stdout, result.stderr)
    [line] = result.stderr.splitlines()
    assert "--database-url" in line and "password" in line
    assert "OUTBOX_DATABASE_URL" in line and "--database-url-file" in line
    assert "s3cret-pw" not in result.stderr + result.stdout
    assert UNREACHABLE_DATABASE not in line, "it connected first"


@pytest.mark.usefixtures("clean_environment")
def test_a_database_url_without_a_password_may_be_given_on_the_command_line(
    tmp_path: Path,
) -> None:
    """(peer or ``.pgpass`` authentication): it is used, as is a URL read from a file."""
    url = f"postgresql+psycopg://u@127.0.0.1:{CLOSED}/x"
    result = CliRunner().invoke(app, ["db", "current", "--database-url", url])
    assert result.exit_code == 2 and UNREACHABLE_DATABASE in result.stderr, result.stderr
    secret = tmp_path / "database-url"
    secret.write_text(f"postgresql+psycopg://u:s3cret-pw@127.0.0.1:{CLOSED}/x\n")
    result = CliRunner().invoke(app, ["db", "current", "--database-url-file", str(secret)])
    assert result.exit_code == 2 and UNREACHABLE_DATABASE in result.stderr, result.stderr
    assert "s3cret-pw" not in result.stderr + result.stdout
    both = CliRunner().invoke(
        app, ["db", "current", "--database-url", url, "--database-url-file", str(secret)]
    )
    assert both.exit_code == 2 and "not both" in both.stderr, both.stderr
    missing = CliRunner().invoke(
        app, ["db", "current", "--database-url-file", str(tmp_path / "none")]
    )
    assert missing.exit_code == 2 and "none" in missing.stderr, missing.stderr
