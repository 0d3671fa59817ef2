"""``outbox stack``: the native local stack (PostgreSQL, the broker, Kafka Connect; with
OUTBOX_STACK_OBJECT_STORE=true an S3-compatible store for the lake)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

from outbox_cli._common import configure_logging, load

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


def _print(lines: list[ServiceLine]) -> None:
    for line in lines:
        state = "running" if line.running else "stopped"
        pid = f"  (pid {line.pid})" if line.pid else ""
        typer.echo(f"{line.name:<9} {state:<8} {line.address}{pid}")
        typer.echo(f"{'':<9} {'log':<8} {line.log}")
        if line.data:
            typer.echo(f"{'':<9} {'data':<8} {line.data}")


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
def status() -> None:
    """Show each service, where it listens, and its log. Exit 1 if one is down."""
    stack = _stack()
    lines = stack.status()
    typer.echo(f"stack folder {stack.settings.root}{_where_from(stack.settings)}")
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
