"""``outbox consumer``: the dead letters of the idempotent consumers (``IdempotentConsumer``).

A record a consumer could not handle waits in its dead letters (``outbox.outbox_inbox_dead_letter``)
until ``outbox db expire`` deletes it (``OUTBOX_DEAD_LETTER_RETENTION``): list them, look at
one, replay it to its topic once the cause is fixed, or discard it. The logic is
:mod:`outbox.consumer_dead_letters`; a consumer role sees only its own consumer names' dead
letters. ``list``, ``show`` and ``discard`` need the base install; ``replay`` the relay extra
(kafka-python).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import typer

from outbox_cli._common import fail, kafka_settings, load
from outbox_cli._output import JSON_OPTION, print_json, print_rows, summary

if TYPE_CHECKING:
    from sqlalchemy import Engine

    from outbox.consumer_dead_letters import (
        DeadLetterPlace,
        DeadLetterSummary,
    )
    from outbox.settings import OutboxSettings

app = typer.Typer(
    help="The idempotent consumers (IdempotentConsumer): their dead letters.",
    no_args_is_help=True,
)
dead_letters_app = typer.Typer(
    help="Records a consumer could not handle: list them, show one, replay them to their "
    "topic, or discard them (`outbox db expire` deletes them after "
    "OUTBOX_DEAD_LETTER_RETENTION).",
    no_args_is_help=True,
)
app.add_typer(dead_letters_app, name="dead-letters")

CONSUMER = typer.Argument(..., help="The consumer's name (IdempotentConsumer's name=).")
TOPIC = typer.Argument(..., help="The record's topic, as `dead-letters list` prints it.")
PARTITION = typer.Argument(..., help="The record's partition.")
OFFSET = typer.Argument(..., help="The record's offset.")
SOME_TOPIC = typer.Argument(None, help="The record's topic (or --all).", show_default=False)
SOME_PARTITION = typer.Argument(None, help="The record's partition.", show_default=False)
SOME_OFFSET = typer.Argument(None, help="The record's offset.", show_default=False)
ORDER_NOTE = (
    "note: a replayed copy comes after everything on its partition, newer events of its "
    "aggregate included: a consumer that needs the aggregate's order must take it as late. "
    "Consumers that already handled the event skip it while their inbox keeps its claim "
    "(OUTBOX_INBOX_RETENTION)."
)


@contextmanager
def _database() -> Iterator[tuple[Engine, OutboxSettings]]:
    """An engine on OUTBOX_DATABASE_URL (disposed at the end), and the outbox settings."""
    from sqlalchemy import create_engine

    from outbox.settings import DatabaseSettings, OutboxSettings

    database_url = load(DatabaseSettings).database_url.get_secret_value()
    settings = load(OutboxSettings)
    engine = create_engine(database_url)
    try:
        yield engine, settings
    finally:
        engine.dispose()


def _place(
    consumer: str,
    topic: str | None,
    partition: int | None,
    offset: int | None,
    all_letters: bool,
) -> DeadLetterPlace | None:
    """The dead letter named, or ``None`` for ``--all``; one or the other, else exit 2."""
    from outbox.consumer_dead_letters import DeadLetterPlace

    given = [value is not None for value in (topic, partition, offset)]
    if any(given) and not all(given):
        raise fail("name a dead letter by TOPIC PARTITION OFFSET, all three")
    if all(given) == all_letters:
        raise fail("give TOPIC PARTITION OFFSET, or --all (not both)")
    if all_letters:
        return None
    assert topic is not None and partition is not None and offset is not None
    return DeadLetterPlace(consumer, topic, partition, offset)


def _no_such(place: DeadLetterPlace) -> typer.Exit:
    return fail(
        f"no dead letter {place} (a consumer role sees only the dead letters of its own "
        "consumer names: `outbox consumer dead-letters list` prints those it sees)"
    )


def _escaped(text: str, keep: str = "") -> str:
    """``text`` with what a terminal would act on or hide (control and format characters)
    escaped as ``\\x1b``, ``\\u200b``; the characters of ``keep`` (newlines) left alone."""
    return "".join(
        char if char.isprintable() or char in keep else char.encode("unicode_escape").decode()
        for char in text
    )


def _bytes_text(data: bytes | None, keep: str = "") -> str:
    """Bytes as text: UTF-8, other bytes escaped (``\\xff``); ``(null)`` for none."""
    if data is None:
        return "(null)"
    return _escaped(data.decode("utf-8", "backslashreplace"), keep)


@dead_letters_app.command("list")
def list_command(
    consumer: str | None = typer.Option(None, "--consumer", help="Only this consumer's."),
    limit: int = typer.Option(100, "--limit", min=1, help="At most this many, oldest first."),
    as_json: bool = JSON_OPTION,
) -> None:
    """Print the dead letters: consumer, record, event id, attempts, when, size and why.

    The record is printed as TOPIC, its partition in brackets, @OFFSET: `show`, `replay`
    and `discard` take it as TOPIC PARTITION OFFSET. The size is the value's. With --json:
    an array of objects, oldest first (topic, partition and offset apart; the key's size
    too, and why a replay is refused, or null)."""
    from outbox.consumer_dead_letters import list_dead_letters

    with _database() as (engine, settings), engine.begin() as connection:
        letters = list_dead_letters(connection, consumer=consumer, limit=limit, settings=settings)
    if as_json:
        print_json([dead_letter_object(letter) for letter in letters])
    else:
        print_rows(DEAD_LETTER_COLUMNS, dead_letter_rows(letters), right=("attempts", "bytes"))
    summary(f"{len(letters)} dead letter(s)")


DEAD_LETTER_COLUMNS = ("consumer", "record", "event id", "attempts", "failed at", "bytes", "reason")


def dead_letter_rows(letters: list[DeadLetterSummary]) -> list[tuple[object, ...]]:
    """The table's rows: what a terminal would act on in the reason escaped (``\\x1b``)."""
    return [
        (
            letter.place.consumer,
            letter.place.record,
            letter.event_id or "(no event id)",
            letter.attempts,
            letter.failed_at.isoformat(timespec="seconds"),
            f"{letter.value_bytes or 0:,}",
            _escaped(" ".join(letter.reason.split())),
        )
        for letter in letters
    ]


def dead_letter_object(letter: DeadLetterSummary) -> dict[str, object]:
    """One dead letter for ``--json``: every field as stored (the reason whole)."""
    return {
        "consumer": letter.place.consumer,
        "topic": letter.place.topic,
        "partition": letter.place.partition,
        "offset": letter.place.offset,
        "event_id": letter.event_id,
        "attempts": letter.attempts,
        "failed_at": letter.failed_at,
        "key_bytes": letter.key_bytes,
        "value_bytes": letter.value_bytes,
        "reason": letter.reason,
        "replay_refusal": letter.replay_refusal(),
    }


@dead_letters_app.command("show")
def show_command(
    consumer: str = CONSUMER,
    topic: str = TOPIC,
    partition: int = PARTITION,
    offset: int = OFFSET,
) -> None:
    """Print one dead letter whole, and whether it can be replayed.

    Its record's key, headers and value as text (bytes that are not UTF-8 escaped: \\xff),
    the reason, the attempts."""
    from outbox.consumer_dead_letters import DeadLetterPlace, get_dead_letter

    place = DeadLetterPlace(consumer, topic, partition, offset)
    with _database() as (engine, settings), engine.begin() as connection:
        letter = get_dead_letter(connection, place, settings=settings)
    if letter is None:
        raise _no_such(place)
    refusal = letter.replay_refusal()
    event_id = letter.event_id or "(none: the record could not be decoded as an outbox event)"
    size = "(null)" if letter.value is None else f"{len(letter.value)} bytes"
    lines = [
        f"consumer:  {letter.place.consumer}",
        f"record:    {letter.place.record}",
        f"event id:  {event_id}",
        f"attempts:  {letter.attempts}",
        f"failed at: {letter.failed_at.isoformat()}",
        f"reason:    {_escaped(letter.reason, keep=chr(10))}",
        f"replay:    {'possible' if refusal is None else 'refused: ' + refusal}",
        f"key:       {_bytes_text(letter.key)}",
        f"headers:   {len(letter.headers)}",
        *(
            f"  {_escaped(name)}: {'(null)' if value is None else _escaped(value)}"
            for name, value in letter.headers
        ),
        f"value:     {size}",
    ]
    typer.echo("\n".join(lines))
    if letter.value is not None:
        typer.echo(_bytes_text(letter.value, keep="\n\t"))


PAST_RETENTION = typer.Option(
    False,
    "--past-inbox-retention",
    help="Replay dead letters older than OUTBOX_INBOX_RETENTION too (refused without it): "
    "consumers that handled their events may no longer hold the claims that make them skip "
    "the copies.",
)


@dead_letters_app.command("replay")
def replay_command(
    consumer: str = CONSUMER,
    topic: str | None = SOME_TOPIC,
    partition: int | None = SOME_PARTITION,
    offset: int | None = SOME_OFFSET,
    all_letters: bool = typer.Option(False, "--all", help="Every dead letter of CONSUMER."),
    past_retention: bool = PAST_RETENTION,
) -> None:
    """Produce dead letters' records again to their topics, then delete them.

    The same key, value and headers; each dead letter is deleted in a transaction that
    commits once the broker acknowledged its copy (acks=all, idempotent producer): if the
    send fails, the dead letter stays.

    Every consumer of the topic gets the copy: those that already handled the event skip it
    while their inbox keeps its claim (OUTBOX_INBOX_RETENTION); CONSUMER handles it now, if
    its handler is fixed. The copy comes after newer events of its aggregate.

    Refused (discard them): a dead letter whose record was not kept byte for byte (headers
    that were not UTF-8), and a conflicting copy (other content under a handled event id).
    Refused unless --past-inbox-retention: one older than OUTBOX_INBOX_RETENTION (the other
    consumers' claims may be gone).
    """
    from outbox.consumer_dead_letters import (
        Replayer,
        get_dead_letter,
        list_dead_letters,
        refusal_to_replay,
        replay_dead_letter,
    )

    place = _place(consumer, topic, partition, offset, all_letters)
    kafka = kafka_settings()  # a bad setting says so before anything is read
    with _database() as (engine, settings):
        with engine.begin() as connection:
            if place is None:
                letters = list_dead_letters(
                    connection, consumer=consumer, limit=None, settings=settings
                )
                candidates = sorted(
                    (
                        item.place,
                        refusal_to_replay(item, settings, past_inbox_retention=past_retention),
                    )
                    for item in letters
                )
            else:
                letter = get_dead_letter(connection, place, settings=settings)
                if letter is None:
                    raise _no_such(place)
                candidates = [
                    (
                        place,
                        refusal_to_replay(letter, settings, past_inbox_retention=past_retention),
                    )
                ]
        refused = [(where, why) for where, why in candidates if why is not None]
        for where, why in refused:
            typer.secho(f"{where}: not replayed: {why}", err=True, fg="red")
        todo = [where for where, why in candidates if why is None]
        replayed, gone = 0, []
        if todo:
            replayer = Replayer(kafka)
            try:
                for where in todo:
                    copy = replay_dead_letter(engine.begin, replayer, where, settings=settings)
                    if copy is None:
                        gone.append(where)  # discarded, expired or replayed meanwhile
                        continue
                    replayed += 1
                    typer.echo(f"{where} replayed as {copy.record}")
            except Exception:
                if replayed:
                    typer.echo(f"{replayed} dead letter(s) replayed before the error", err=True)
                raise
            finally:
                replayer.close()
    typer.echo(f"{replayed} dead letter(s) replayed")
    if replayed:
        typer.echo(ORDER_NOTE, err=True)
    if gone:
        typer.secho(
            f"gone meanwhile: {', '.join(str(where) for where in gone)}", err=True, fg="red"
        )
    if refused or gone:
        raise typer.Exit(2)


@dead_letters_app.command("discard")
def discard_command(
    consumer: str = CONSUMER,
    topic: str | None = SOME_TOPIC,
    partition: int | None = SOME_PARTITION,
    offset: int | None = SOME_OFFSET,
    all_letters: bool = typer.Option(False, "--all", help="Every dead letter of CONSUMER."),
    yes: bool = typer.Option(False, "--yes", help="Yes: delete them for good."),
) -> None:
    """Delete dead letters for good: CONSUMER never handles their records.

    Replay them instead once the cause is fixed; discard what must not be handled, or
    cannot be replayed."""
    from outbox.consumer_dead_letters import discard_dead_letters

    place = _place(consumer, topic, partition, offset, all_letters)
    if not yes:
        what = f"the dead letter {place}" if place else f"every dead letter of {consumer}"
        raise fail(
            f"discarding deletes {what} for good: {consumer} never handles the record(s). "
            "Run again with --yes"
        )
    with _database() as (engine, settings), engine.begin() as connection:
        gone = discard_dead_letters(
            connection, consumer, None if place is None else [place], settings=settings
        )
    typer.echo(f"{len(gone)} dead letter(s) discarded")
    if place is not None and not gone:
        raise _no_such(place)
