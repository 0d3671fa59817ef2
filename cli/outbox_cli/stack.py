"""``outbox stack``: the native local stack (PostgreSQL, the broker, Kafka Connect; with
OUTBOX_STACK_OBJECT_STORE=true an S3-compatible store for the lake)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

from outbox_cli._common import configure_logging, load
from outbox_cli._output import JSON_OPTION, print_json, print_rows

if TYPE_CHECKING:
    from outbox_stack.local import LocalStack, ServiceLine
    from outbox_stack.settings import StackSettings

app = typer.Typer(
    help="Run the local stack natively on loopback (no Docker).", no_args_is_help=True
)


def _stack() -> LocalStack:
    from outbox.settings import KafkaSettings
    from outbox_stack.local import LocalStack
    from outbox_stack.settings import StackSettings

    return LocalStack(load(StackSettings), load(KafkaSettings))


def _where_from(settings: StackSettings) -> str:
    """How the stack's folder was found, and how to point elsewhere."""
    import os

    from outbox_stack.settings import DEFAULT_DIR

    if os.environ.get("OUTBOX_STACK_DIR"):
        return " (OUTBOX_STACK_DIR)"
    if DEFAULT_DIR.resolve() == settings.root:
        return " (.stack in the current folder; OUTBOX_STACK_DIR points elsewhere)"
    return " (the stack last started; OUTBOX_STACK_DIR points elsewhere)"


SERVICE_COLUMNS = ("service", "state", "pid", "address", "files")


def service_rows(lines: list[ServiceLine]) -> list[tuple[object, ...]]:
    """The table's rows: each service's log, and its data folder if it has one, in one cell."""
    return [
        (
            line.name,
            "running" if line.running else "stopped",
            line.pid,
            line.address,
            f"log  {line.log}" + (f"\ndata {line.data}" if line.data else ""),
        )
        for line in lines
    ]


def services_summary(lines: list[ServiceLine]) -> str:
    """One line: how many services run, and which do not."""
    stopped = [line.name for line in lines if not line.running]
    line = f"{len(lines) - len(stopped)} of {len(lines)} services running"
    return f"{line}; stopped: {', '.join(stopped)}" if stopped else line


def status_object(lines: list[ServiceLine], folder: Path, found: str) -> dict[str, object]:
    """``stack status --json``: the folder, how it was found, and each service."""
    return {
        "folder": folder,
        "found": found,
        "running": all(line.running for line in lines),
        "services": [
            {
                "name": line.name,
                "running": line.running,
                "pid": line.pid,
                "address": line.address,
                "log": line.log,
                "data": line.data,
            }
            for line in lines
        ],
    }


def _print(lines: list[ServiceLine]) -> None:
    print_rows(SERVICE_COLUMNS, service_rows(lines), right=("pid",))
    typer.echo(services_summary(lines))


@app.command()
def up(verbose: bool = typer.Option(False, "--verbose", "-v", help="Log each step.")) -> None:
    """Install what is missing, start every service, and wait until each really answers.

    Idempotent: services already running are left alone.
    """
    from outbox_stack.settings import remember_stack

    configure_logging(verbose)
    stack = _stack()
    lines = stack.up()
    _print(lines)
    pointer = remember_stack(stack.settings)
    found = f" (found from any folder: {pointer})" if pointer else ""
    typer.echo(f"stack folder {stack.settings.root}{found}")
    typer.echo('Use it from your shell with:  eval "$(outbox stack env)"')


@app.command()
def down() -> None:
    """Stop every service (Connect, broker, object store, Postgres). Each keeps its data."""
    stack = _stack()
    stack.down()
    _print(stack.status())


@app.command()
def status(as_json: bool = JSON_OPTION) -> None:
    """Show each service, where it listens, its log and data folder (--json: one object).
    Exit 1 if one is down."""
    stack = _stack()
    lines = stack.status()
    found = _where_from(stack.settings)
    if as_json:
        print_json(status_object(lines, stack.settings.root, found.strip(" ()")))
    else:
        typer.echo(f"stack folder {stack.settings.root}{found}")
        _print(lines)
    if not all(line.running for line in lines):
        raise typer.Exit(1)


@app.command()
def logs(lines: int = typer.Option(50, "--lines", "-n", min=1, help="How many lines.")) -> None:
    """Print the end of each service's log."""
    for name, content in _stack().logs().items():
        typer.echo(f"==> {name} <==")
        typer.echo("\n".join(content[-lines:]) if content else "(no log yet)")


@app.command()
def env() -> None:
    """Print `export` lines that point the SDK and the CLI at the local stack.

    The database URL (the superuser's; it verifies PostgreSQL's certificate with the stack's
    CA, sslmode=verify-full), the connector's TLS settings, the broker, Connect, and the
    generated passwords of the CDC and relay roles (for `outbox db cdc-role` and
    `outbox db relay-role`); with OUTBOX_STACK_OBJECT_STORE=true, the lake's root on the
    stack's S3 store and the AWS variables with its generated keys: eval the output, do not
    paste it anywhere.
    """
    from outbox_stack.local import shell_exports

    stack = _stack()
    exports = shell_exports(stack.environment())
    typer.echo(exports, nl=False)


@app.command()
def destroy(
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask for confirmation."),
) -> None:
    """Stop every service and delete the stack's data (the database too, also when it lives
    outside the stack folder; the broker's topics; the object store's lake). Downloads in
    .cache/ are kept."""
    stack = _stack()
    if not yes:
        typer.confirm(
            f"Delete the database in {stack.postgres.data_dir}, the broker's topics and the "
            "stack's logs?",
            abort=True,
        )
    from outbox_stack.settings import forget_stack

    stack.destroy()
    forget_stack(stack.settings)
    typer.echo(f"deleted the stack of {stack.settings.root}")
