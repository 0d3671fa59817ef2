"""``python -m chaos`` (``make chaos``): see chaos/__init__.py.

Exit status: 0 when the run passed; 1 on any violation; 2 when a setting is invalid or the
stack could not be brought up or back (one line naming it; the services' logs stay in the
stack's folder). Anything else is a bug of the suite, shown with its traceback.
"""

from __future__ import annotations

import typer
from pydantic import ValidationError
from rich.console import Console

from chaos.run import run
from chaos.settings import ChaosSettings
from outbox import OutboxError

app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)

SETUP_ERRORS = (OutboxError, RuntimeError, AssertionError)
"""A service that would not start or come back (``StackError``, ``ConnectError``), a process
that exited, a wait past its deadline (``not within 240 s: the lake job started``)."""


def _settings(**given: object) -> ChaosSettings:
    try:
        return ChaosSettings.for_run(**given)  # type: ignore[arg-type]
    except ValidationError as error:
        problems = "; ".join(
            f"--{str(item['loc'][0]).replace('_seconds', '').replace('_', '-')} "
            f"(OUTBOX_CHAOS_{str(item['loc'][0]).upper()}): {item['msg']}"
            for item in error.errors()
        )
        typer.secho(f"error: invalid settings: {problems}", err=True, fg="red")
        raise typer.Exit(2) from None


@app.command()
def main(
    seed: int | None = typer.Option(None, help="Seed of the faults and writers (replays a run)."),
    duration: float | None = typer.Option(
        None, help="Seconds of load while faults are injected (default 420; --short: 100)."
    ),
    short: bool = typer.Option(False, help="The CI profile: 3 to 4 minutes, each fault once."),
    events_per_second: float | None = typer.Option(None, help="The writers' combined rate."),
    faults_per_kind: int | None = typer.Option(None, help="Faults of each kind (default 2)."),
    drain_timeout: float | None = typer.Option(
        None, help="Seconds the outbox may take to empty and the lake to catch up (420)."
    ),
    keep: bool = typer.Option(False, help="Keep the stack's data after a passing run."),
) -> None:
    """Drive the native stack under load while faults are injected; check that no event was
    lost, duplicated in the lake, phantom or out of order; exit 1 on any violation."""
    settings = _settings(
        short=short,
        seed=seed,
        duration_seconds=duration,
        events_per_second=events_per_second,
        faults_per_kind=faults_per_kind,
        drain_timeout_seconds=drain_timeout,
        keep=keep or None,
    )
    console = Console()
    try:
        passed = run(settings, console)
    except SETUP_ERRORS as error:
        console.print(
            f"[red]error: {type(error).__name__}: {error}[/red] (seed {settings.seed}; logs in "
            f"{settings.stack_dir})"
        )
        raise typer.Exit(2) from None
    raise typer.Exit(0 if passed else 1)


if __name__ == "__main__":
    app()
