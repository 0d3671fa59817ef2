"""``python -m chaos`` (``make chaos``): see chaos/__init__.py. Exit status 0 when the run
passed, 1 on any violation (or a bug, said so), 2 for a setting or a service that is not
right (one line naming it)."""

from __future__ import annotations

import typer
from pydantic import ValidationError
from rich.console import Console

from chaos.run import run
from chaos.settings import ChaosSettings
from cli._common import fail, friendly_errors

app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)


def _settings(**given: object) -> ChaosSettings:
    try:
        return ChaosSettings.for_run(**given)  # type: ignore[arg-type]
    except ValidationError as error:
        problems = "; ".join(
            f"--{str(item['loc'][0]).replace('_seconds', '').replace('_', '-')} "
            f"(OUTBOX_CHAOS_{str(item['loc'][0]).upper()}): {item['msg']}"
            for item in error.errors()
        )
        raise fail(f"error: invalid settings: {problems}") from None


@app.command()
def main(
    seed: int | None = typer.Option(None, help="Seed of the faults and writers (replays a run)."),
    duration: float | None = typer.Option(
        None, help="Seconds of load while faults are injected (default 420; --short: 100)."
    ),
    short: bool = typer.Option(False, help="The CI profile: 2 to 4 minutes, each fault once."),
    events_per_second: float | None = typer.Option(None, help="The writers' combined rate."),
    faults_per_kind: int | None = typer.Option(None, help="Faults of each kind (default 2)."),
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
        keep=keep or None,
    )
    with friendly_errors():
        passed = run(settings, Console())
    raise typer.Exit(0 if passed else 1)


if __name__ == "__main__":
    app()
