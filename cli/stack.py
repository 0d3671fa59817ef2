"""``outbox stack``: the native local stack (for now, the private PostgreSQL)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

from cli._common import configure_logging, friendly_errors, load

if TYPE_CHECKING:
    from stack import PostgresCluster

app = typer.Typer(
    help="Run the local stack natively on loopback (no Docker).", no_args_is_help=True
)


def _cluster() -> PostgresCluster:
    from stack import PostgresCluster, StackSettings

    return PostgresCluster(load(StackSettings))


@app.command()
def up(verbose: bool = typer.Option(False, "--verbose", "-v", help="Log each step.")) -> None:
    """Install (as root), initialise and start every service; wait until each answers."""
    configure_logging(verbose)
    cluster = _cluster()
    with friendly_errors():
        status = cluster.up()
    typer.echo(f"postgres  up    {cluster.display_url()}  (pid {status.pid})")
    typer.echo(f"          logs  {status.log_file}")
    typer.echo('Use it from your shell with:  eval "$(outbox stack env)"')


@app.command()
def down() -> None:
    """Stop every service of the stack. Data is kept; `up` starts them again."""
    cluster = _cluster()
    with friendly_errors():
        cluster.down()
    typer.echo("postgres  stopped")


@app.command()
def status() -> None:
    """Show which services run, where they listen, and their logs. Exit 1 if one is down."""
    cluster = _cluster()
    with friendly_errors():
        state = cluster.status()
    if state.running:
        typer.echo(f"postgres  running  {cluster.display_url()}  (pid {state.pid})")
    else:
        typer.echo(f"postgres  stopped  (data in {state.data_dir})")
    typer.echo(f"          logs     {state.log_file}")
    if not state.running:
        raise typer.Exit(1)


@app.command()
def logs(lines: int = typer.Option(50, "--lines", "-n", min=1, help="How many lines.")) -> None:
    """Print the end of each service's log."""
    cluster = _cluster()
    if not cluster.log_file.exists():
        typer.echo("postgres  no log yet: run `outbox stack up`")
        return
    tail = cluster.log_file.read_text(errors="replace").splitlines()[-lines:]
    typer.echo(f"==> {cluster.log_file} <==")
    typer.echo("\n".join(tail))


@app.command()
def env() -> None:
    """Print `export` lines that point the SDK and the CLI at the local stack.

    The output holds the generated database password: eval it, do not paste it anywhere.
    """
    cluster = _cluster()
    with friendly_errors():
        url = cluster.url()
    typer.echo(f"export OUTBOX_DATABASE_URL='{url}'")
