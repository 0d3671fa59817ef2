"""``outbox relay``: the polling relay, and its dead letters."""

from __future__ import annotations

import signal
import threading
import uuid
from types import FrameType
from typing import TYPE_CHECKING

import typer

from outbox_cli._common import kafka_settings, load
from outbox_cli._output import JSON_OPTION, print_json, print_rows, summary

if TYPE_CHECKING:
    from outbox_relay.dead_letters import DeadLetter

app = typer.Typer(help="The polling relay: outbox rows to Kafka without CDC.", no_args_is_help=True)
dead_letters_app = typer.Typer(
    help="Rows the broker refused (too large, invalid): list them, replay them, or discard "
    "them (kept until then: no retention deletes them).",
    no_args_is_help=True,
)
app.add_typer(dead_letters_app, name="dead-letters")


@app.command()
def run(
    log_level: str = typer.Option("INFO", "--log-level", help="DEBUG, INFO, WARNING or ERROR."),
) -> None:
    """Run the relay until SIGTERM or SIGINT (the batch in flight finishes; exit 0).

    Settings: OUTBOX_RELAY_* (mode, batch size, grace, HTTP port, producer), plus
    OUTBOX_DATABASE_URL, OUTBOX_KAFKA_BOOTSTRAP_SERVERS and, for the CDC heartbeat topic it
    watches in auto mode, OUTBOX_CONNECT_TOPIC_PREFIX. Logs are JSON on stderr;
    /healthz, /readyz and /metrics on OUTBOX_RELAY_HTTP_HOST:OUTBOX_RELAY_HTTP_PORT.
    """
    from outbox.settings import DatabaseSettings, OutboxSettings
    from outbox_connect.settings import ConnectorSettings
    from outbox_relay.collector import collect_young_rarely
    from outbox_relay.database import libpq_conninfo
    from outbox_relay.health import HealthServer
    from outbox_relay.logs import configure_json_logging
    from outbox_relay.metrics import RelayMetrics, SlotWatch
    from outbox_relay.service import Relay
    from outbox_relay.settings import RelaySettings

    if log_level.upper() not in {"DEBUG", "INFO", "WARNING", "ERROR"}:
        typer.secho("--log-level: use DEBUG, INFO, WARNING or ERROR", err=True, fg="red")
        raise typer.Exit(2)
    settings = load(RelaySettings)
    database_url = load(DatabaseSettings).database_url.get_secret_value()
    tables = load(OutboxSettings).tables
    configure_json_logging(log_level.upper())
    collect_young_rarely()  # this process only relays: its batches die young (the module says)
    # The replication slots' state for /metrics, read on a thread and connection of its own.
    slots = SlotWatch(libpq_conninfo(database_url))
    relay = Relay(
        settings,
        database_url=database_url,
        kafka=kafka_settings(),
        tables=tables,
        cdc_topic_prefix=load(ConnectorSettings).topic_prefix,
        metrics=RelayMetrics(slots=slots.latest),
    )
    stop = threading.Event()

    def request_stop(signum: int, _frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    server = None
    if settings.http_port:
        server = HealthServer(settings.http_host, settings.http_port, relay.liveness, relay.metrics)
        server.start()
        slots.start()
    try:
        relay.run(stop)  # a start-up check that fails: its message, exit 2 (outbox_cli.main)
    finally:
        if server is not None:
            server.stop()
        slots.close()


@app.command()
def health(
    path: str = typer.Option("/healthz", "--path", help="/healthz or /readyz."),
) -> None:
    """Exit 0 when the local relay answers PATH with 200 (the container's health check)."""
    from outbox_relay.probe import probe
    from outbox_relay.settings import RelaySettings

    settings = load(RelaySettings)
    if path not in {"/healthz", "/readyz"}:
        typer.secho("--path: /healthz or /readyz", err=True, fg="red")
        raise typer.Exit(2)
    answer = probe(f"http://127.0.0.1:{settings.http_port}", path)
    body = answer.body
    if not answer.answered:
        body = (
            f"not ok: no answer at {answer.url} (is the relay running with "
            f"OUTBOX_RELAY_HTTP_PORT={settings.http_port}?)"
        )
    typer.echo(body.strip())  # "ok: leader: publishing (polling mode)" and the like
    raise typer.Exit(0 if answer.ok else 1)


@dead_letters_app.command("list")
def list_command(
    limit: int = typer.Option(100, "--limit", min=1, help="At most this many, oldest first."),
    as_json: bool = JSON_OPTION,
) -> None:
    """Print the dead letters: event id, aggregate, type, size, when and why (--json: an
    array of objects, oldest first)."""
    from outbox.settings import DatabaseSettings, OutboxSettings
    from outbox_relay.dead_letters import list_dead_letters

    database_url = load(DatabaseSettings).database_url.get_secret_value()
    letters = list_dead_letters(database_url, load(OutboxSettings).tables, limit)
    if as_json:
        print_json([dead_letter_object(letter) for letter in letters])
    else:
        print_rows(DEAD_LETTER_COLUMNS, dead_letter_rows(letters), right=("bytes",))
    summary(f"{len(letters)} dead letter(s)")


DEAD_LETTER_COLUMNS = ("event id", "aggregate", "event type", "bytes", "failed at", "reason")


def dead_letter_rows(letters: list[DeadLetter]) -> list[tuple[object, ...]]:
    return [
        (
            letter.id,
            f"{letter.aggregate_type}/{letter.aggregate_id}",
            letter.event_type,
            f"{letter.payload_bytes:,}",
            letter.failed_at.isoformat(timespec="seconds"),
            " ".join(letter.reason.split()),
        )
        for letter in letters
    ]


def dead_letter_object(letter: DeadLetter) -> dict[str, object]:
    return {
        "event_id": letter.id,
        "aggregate_type": letter.aggregate_type,
        "aggregate_id": letter.aggregate_id,
        "event_type": letter.event_type,
        "payload_bytes": letter.payload_bytes,
        "failed_at": letter.failed_at,
        "reason": letter.reason,
    }


EVENT_IDS_ARGUMENT = typer.Argument(None, help="Event ids; none: use --all.")


def _event_ids(values: list[str]) -> list[uuid.UUID]:
    try:
        return [uuid.UUID(value) for value in values]
    except ValueError:
        typer.secho(
            "event ids must be UUIDs, as `dead-letters list` prints them", err=True, fg="red"
        )
        raise typer.Exit(2) from None


@dead_letters_app.command("retry")
def retry_command(
    event_ids: list[str] | None = EVENT_IDS_ARGUMENT,
    all_letters: bool = typer.Option(False, "--all", help="Replay every dead letter."),
) -> None:
    """Put dead letters back into the outbox to be published again (same event ids)."""
    from outbox.settings import DatabaseSettings, OutboxSettings
    from outbox_relay.dead_letters import retry_dead_letters

    if bool(event_ids) == all_letters:
        typer.secho("give event ids, or --all (not both)", err=True, fg="red")
        raise typer.Exit(2)
    ids = _event_ids(event_ids) if event_ids else None
    database_url = load(DatabaseSettings).database_url.get_secret_value()
    moved = retry_dead_letters(database_url, load(OutboxSettings).tables, ids)
    typer.echo(f"{len(moved)} dead letter(s) back in the outbox")


DISCARD_IDS_ARGUMENT = typer.Argument(..., help="Event ids, as `dead-letters list` prints them.")


@dead_letters_app.command("discard")
def discard_command(
    event_ids: list[str] = DISCARD_IDS_ARGUMENT,
    yes: bool = typer.Option(False, "--yes", help="Yes: delete them for good."),
) -> None:
    """Delete dead letters for good: their events are never published. Replay them instead
    with `retry` once the cause is fixed; discard only what must not be published."""
    from outbox.settings import DatabaseSettings, OutboxSettings
    from outbox_relay.dead_letters import discard_dead_letters

    ids = _event_ids(event_ids)
    if not yes:
        typer.secho(
            f"discarding deletes {len(ids)} dead letter(s) for good: their events are never "
            "published. Run again with --yes",
            err=True,
            fg="red",
        )
        raise typer.Exit(2)
    database_url = load(DatabaseSettings).database_url.get_secret_value()
    gone = set(discard_dead_letters(database_url, load(OutboxSettings).tables, ids))
    typer.echo(f"{len(gone)} dead letter(s) discarded")
    missing = [str(event_id) for event_id in ids if event_id not in gone]
    if missing:
        typer.secho(f"no dead letter with id {', '.join(missing)}", err=True, fg="red")
        raise typer.Exit(2)


def aggregate_types_on_kafka() -> list[str]:
    """The aggregate types of the outbox topics (``outbox.event.<type>``) on the broker,
    sorted (``outbox db register-types --from-kafka``)."""
    import re

    from outbox.core.contract import TOPIC_PREFIX
    from outbox.kafka_reading import KafkaReader, ReaderRole

    reader = KafkaReader(kafka_settings(), ReaderRole(client_id="outbox-register-types"))
    try:
        topics = reader.topics(f"^{re.escape(TOPIC_PREFIX)}")
    finally:
        reader.close()
    return [topic[len(TOPIC_PREFIX) :] for topic in topics]
