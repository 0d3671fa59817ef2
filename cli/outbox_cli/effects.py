"""``outbox effects``: steps of the side-effect ledger that wait for an operator's decision.

A step is parked when its call to a third party was cut short (a crash) and no lookup could
tell whether the third party acted. Ask the third party about the step's idempotency key
(``list`` prints it), then ``mark-done`` (it acted: give its reference) or ``release`` (it did
not: the consumer calls once more, with the same key, at its next start).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from outbox_cli._output import JSON_OPTION, print_json, print_rows, summary
from outbox_cli.db import DATABASE_URL_FILE_OPTION, DATABASE_URL_OPTION, _database

if TYPE_CHECKING:
    from outbox.effect_decisions import ParkedStep

app = typer.Typer(
    help="Calls to third parties cut short by a crash: list them, decide them.",
    no_args_is_help=True,
)

CONSUMER = typer.Argument(..., help="The consumer (the ledger's consumer name).")
EVENT_ID = typer.Argument(..., help="The event id, as `outbox effects list` prints it.")
EFFECT = typer.Argument(..., help="The effect's name, e.g. charge.")


@app.command("list")
def list_command(
    consumer: str | None = typer.Option(None, "--consumer", help="Only this consumer's steps."),
    limit: int = typer.Option(100, "--limit", min=1, help="At most this many, oldest first."),
    database_url: str | None = DATABASE_URL_OPTION,
    database_url_file: Path | None = DATABASE_URL_FILE_OPTION,
    as_json: bool = JSON_OPTION,
) -> None:
    """Print the steps that need a decision: names, idempotency key, age, reason, context
    (--json: an array of objects, oldest first)."""
    from datetime import UTC

    from outbox.effect_decisions import steps_needing_decision

    with _database(database_url, database_url_file) as (connection, settings):
        steps = steps_needing_decision(
            connection, consumer=consumer, limit=limit, settings=settings
        )
    now = datetime.now(UTC)
    if as_json:
        print_json([step_object(step, now) for step in steps])
    else:
        print_rows(STEP_COLUMNS, step_rows(steps, now), right=("attempt",))
    summary(f"{len(steps)} step(s) need a decision")


STEP_COLUMNS = ("consumer", "event id", "effect", "idempotency key", "attempt", "parked", "why")
CONTEXT_SHOWN = 500
"""Characters of a step's context the table shows (--json: all of it)."""


def step_rows(steps: list[ParkedStep], now: datetime) -> list[tuple[object, ...]]:
    """The table's rows; the last cell holds the reason and the context, on two lines."""
    from outbox.core.payload import encode_parsed_json

    return [
        (
            step.consumer,
            step.event_id,
            step.effect,
            step.idempotency_key,
            step.attempt,
            f"{step.parked_at.isoformat(timespec='seconds')}\n"
            f"({_seconds(now - step.parked_at):,} s ago)",
            f"reason: {step.reason or '-'}\n"
            f"context: {encode_parsed_json(step.context)[:CONTEXT_SHOWN]}",
        )
        for step in steps
    ]


def step_object(step: ParkedStep, now: datetime) -> dict[str, object]:
    """One step for ``--json``: its context as the JSON it was stored as."""
    return {
        "consumer": step.consumer,
        "event_id": step.event_id,
        "effect": step.effect,
        "idempotency_key": step.idempotency_key,
        "attempt": step.attempt,
        "started_at": step.started_at,
        "parked_at": step.parked_at,
        "waited_seconds": _seconds(now - step.parked_at),
        "reason": step.reason,
        "context": step.context,
    }


def _seconds(waited: timedelta) -> int:
    return int(waited.total_seconds())


@app.command("mark-done")
def mark_done_command(
    consumer: str = CONSUMER,
    event_id: str = EVENT_ID,
    effect: str = EFFECT,
    reference: str | None = typer.Option(
        None, "--reference", help="The third party's id for what it did (recommended)."
    ),
    database_url: str | None = DATABASE_URL_OPTION,
    database_url_file: Path | None = DATABASE_URL_FILE_OPTION,
) -> None:
    """The third party did act: mark the step done; it is never called again."""
    from outbox.effect_decisions import mark_done

    with _database(database_url, database_url_file) as (connection, settings):
        mark_done(
            connection,
            consumer=consumer,
            event_id=event_id,
            effect=effect,
            reference=reference,
            settings=settings,
        )
    typer.echo(f"{consumer}/{event_id}/{effect}: done")


@app.command("release")
def release_command(
    consumer: str = CONSUMER,
    event_id: str = EVENT_ID,
    effect: str = EFFECT,
    database_url: str | None = DATABASE_URL_OPTION,
    database_url_file: Path | None = DATABASE_URL_FILE_OPTION,
) -> None:
    """The third party did not act: allow one more attempt (same idempotency key)."""
    from outbox.effect_decisions import release

    with _database(database_url, database_url_file) as (connection, settings):
        release(connection, consumer=consumer, event_id=event_id, effect=effect, settings=settings)
    typer.echo(
        f"{consumer}/{event_id}/{effect}: released; the consumer calls once more when it "
        "performs released steps (Effects.perform_released)"
    )
