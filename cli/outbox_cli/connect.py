"""``outbox connect``: the Debezium connector of the CDC path, through Connect's REST API."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import typer

from outbox_cli._common import kafka_settings, load
from outbox_cli._output import JSON_OPTION, print_json
from outbox_connect.open_transactions import IDLE_SECONDS

if TYPE_CHECKING:
    from outbox_connect.client import ConnectorState
    from outbox_connect.open_transactions import OpenTransaction

app = typer.Typer(help="Apply and watch the Debezium connector (CDC path).", no_args_is_help=True)


@app.command()
def apply(
    wait: bool = typer.Option(True, help="Wait until the connector and its task run."),
) -> None:
    """Create or update the connector from connect/outbox_connect/outbox-connector.json.
    Idempotent."""
    from outbox.settings import OutboxSettings
    from outbox_connect import ConnectClient, ConnectorSettings, render_connector_config

    settings = load(ConnectorSettings)
    config = render_connector_config(settings, load(OutboxSettings))
    client = ConnectClient(settings.url)
    changed = client.apply(settings.name, config)
    if wait:
        client.wait_running(settings.name)
    typer.echo(f"connector {settings.name}: {'applied' if changed else 'unchanged'}")


@app.command()
def status(as_json: bool = JSON_OPTION) -> None:
    """Connector and task states; transactions left open on Connect's offsets topic; the
    replication slot's state, retained WAL (lag) in bytes, and PostgreSQL's
    max_slot_wal_keep_size with a recommendation (--json: all of it in one object).

    The slot report needs OUTBOX_DATABASE_URL. Exit 1 unless everything runs and no hanging
    transaction holds Connect's offsets topic.
    """
    import os

    from outbox.core.errors import OutboxError
    from outbox_connect import ConnectClient, ConnectorSettings
    from outbox_connect.open_transactions import open_transactions

    settings = load(ConnectorSettings)
    state = ConnectClient(settings.url).state(settings.name)
    # Checked whatever the connector's state: a worker held by a hanging transaction
    # answers REST yet lists no connector.
    unchecked: str | None = None
    try:
        held = open_transactions(kafka_settings(), settings.offsets_topic)
    except OutboxError as error:  # Connect may be up while the broker is not
        unchecked, held = str(error), []
    slot = _slot_state(settings.slot_name) if os.environ.get("OUTBOX_DATABASE_URL") else None
    report = ConnectStatus(settings.name, state, settings.offsets_topic, held, unchecked, slot)
    if as_json:
        print_json(report.to_dict())
    else:
        for line in report.lines():
            typer.echo(line)
    if not report.ok:
        raise typer.Exit(1)


@dataclass(frozen=True)
class SlotState:
    """The replication slot, as PostgreSQL has it (``state`` None: there is no such slot)."""

    name: str
    state: str | None
    """``active`` or ``inactive``."""
    retained_wal_bytes: int
    wal_status: str
    max_slot_wal_keep_size: str

    @property
    def unbounded(self) -> bool:
        return self.max_slot_wal_keep_size in {"-1", "-1kB", "-1MB"}

    def lines(self) -> list[str]:
        """The slot's state and lag, and what bounds the WAL it keeps (with a
        recommendation)."""
        found = (
            f"slot {self.name}: missing"
            if self.state is None
            else f"slot {self.name}: {self.state}, retained WAL "
            f"{self.retained_wal_bytes:,} bytes, wal_status {self.wal_status}"
        )
        if self.unbounded:
            bound = (
                "max_slot_wal_keep_size: unlimited. A stopped connector keeps WAL until the "
                "disk is full and PostgreSQL stops. Recommended: a bound the disk can hold, "
                "e.g. ALTER SYSTEM SET max_slot_wal_keep_size = '10GB'; SELECT "
                "pg_reload_conf(); past it the slot is invalidated (wal_status 'lost'): "
                "recreate the connector, and run the relay in auto mode so that no event "
                "waits meanwhile"
            )
        else:
            bound = (
                f"max_slot_wal_keep_size: {self.max_slot_wal_keep_size} (past it the slot is "
                "invalidated: recreate the connector; the relay in auto mode publishes "
                "meanwhile)"
            )
        return [found, bound]


@dataclass(frozen=True)
class ConnectStatus:
    """What `connect status` found: the connector, its offsets topic's open transactions
    (``unchecked``: why they could not be read), and the slot (None: not asked)."""

    name: str
    state: ConnectorState | None
    offsets_topic: str
    held: list[OpenTransaction]
    unchecked: str | None = None
    slot: SlotState | None = None

    @property
    def hanging(self) -> bool:
        return any(transaction.hanging for transaction in self.held)

    @property
    def ok(self) -> bool:
        return self.state is not None and self.state.running and not self.hanging

    def lines(self) -> list[str]:
        found = []
        if self.state is None:
            found.append(f"connector {self.name}: not created (run `outbox connect apply`)")
        else:
            found.append(f"connector {self.name}: {self.state.connector}")
            for task, task_state, trace in self.state.tasks:
                found.append(f"  task {task}: {task_state}")
                if trace:
                    found.append("    " + trace.splitlines()[0][:300])
        if self.unchecked is not None:
            found.append(f"offsets topic {self.offsets_topic}: not checked ({self.unchecked})")
        elif not self.held:
            found.append(f"offsets topic {self.offsets_topic}: no transaction left open")
        found.extend(transaction.describe() for transaction in self.held)
        if self.hanging:
            found.append(
                "  a hanging transaction holds every exactly-once worker at start-up: abort it "
                "with `outbox connect unblock` (loses nothing; each line above says whether it "
                "re-delivers)"
            )
        if self.slot is not None:
            found.extend(self.slot.lines())
        return found

    def to_dict(self) -> dict[str, object]:
        """``connect status --json``: every line's facts as fields."""
        state = self.state
        return {
            "ok": self.ok,
            "connector": {
                "name": self.name,
                "state": None if state is None else state.connector,
                "running": state is not None and state.running,
                "tasks": [
                    {"id": task, "state": task_state, "trace": trace}
                    for task, task_state, trace in (state.tasks if state else [])
                ],
            },
            "offsets_topic": {
                "name": self.offsets_topic,
                "checked": self.unchecked is None,
                "error": self.unchecked,
                "hanging": self.hanging,
                "open_transactions": [
                    {
                        "partition": t.partition,
                        "producer_id": t.producer_id,
                        "producer_epoch": t.producer_epoch,
                        "transactional_id": t.transactional_id,
                        "first_offset": t.first_offset,
                        "idle_seconds": round(t.idle_seconds, 3),
                        "coordinator_state": t.coordinator_state,
                        "hanging": t.hanging,
                        "abort_redelivers": t.abort_redelivers,
                        "description": t.describe(),
                    }
                    for t in self.held
                ],
            },
            "slot": None
            if self.slot is None
            else {
                "name": self.slot.name,
                "state": self.slot.state or "missing",
                "retained_wal_bytes": self.slot.retained_wal_bytes,
                "wal_status": self.slot.wal_status,
                "max_slot_wal_keep_size": self.slot.max_slot_wal_keep_size,
                "unbounded": self.slot.unbounded,
                "advice": self.slot.lines()[1],
            },
        }


@app.command()
def restart() -> None:
    """Restart the connector and all its tasks (Debezium resumes from its stored offsets)."""
    from outbox_connect import ConnectClient, ConnectorSettings

    settings = load(ConnectorSettings)
    client = ConnectClient(settings.url)
    client.restart(settings.name)
    state = client.wait_running(settings.name)
    typer.echo(f"connector {settings.name}: {state.connector}")


@app.command()
def unblock(
    idle_seconds: float = typer.Option(
        IDLE_SECONDS,
        min=0,
        help="Abort only transactions whose producer has been silent this long.",
    ),
) -> None:
    """Abort the hanging transactions on Connect's offsets topic (OUTBOX_CONNECT_OFFSETS_TOPIC):
    those no transaction coordinator counts as open, which Kafka never ends by itself and
    which hold an exactly-once worker at start-up (it answers REST but starts no connector).
    Loses nothing: the task resumes from the last offsets its readers see committed; one its
    coordinator recorded committed (the marker never came) is re-delivered, and each line
    says so. Transactions a coordinator still owns are left to it
    (it aborts them after their timeout). Exit 1 if a hanging one remains."""
    from outbox_connect import ConnectorSettings
    from outbox_connect.open_transactions import unblock as unblock_topic

    settings = load(ConnectorSettings)
    aborted, left = unblock_topic(
        kafka_settings(), settings.offsets_topic, idle_seconds=idle_seconds
    )
    for transaction in aborted:
        typer.echo(f"aborted: {transaction.describe()}")
    for transaction in left:
        typer.echo(f"still open: {transaction.describe()}")
        if transaction.hanging:
            typer.echo(
                f"  silent less than {transaction.silence_needed(idle_seconds):g} s: run "
                "again later, or with a lower --idle-seconds"
            )
    if not aborted and not left:
        typer.echo(f"offsets topic {settings.offsets_topic}: no transaction left open")
    if any(transaction.hanging for transaction in left):
        raise typer.Exit(1)


def _slot_state(slot: str) -> SlotState:
    """The slot's state and lag, and PostgreSQL's bound on the WAL it keeps."""
    from sqlalchemy import create_engine, text

    from outbox.settings import DatabaseSettings

    engine = create_engine(load(DatabaseSettings).database_url.get_secret_value())
    try:
        with engine.connect() as connection:
            row = connection.execute(
                text(
                    "SELECT CASE WHEN active THEN 'active' ELSE 'inactive' END, "
                    "pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::bigint, "
                    "coalesce(wal_status, 'unknown') "
                    "FROM pg_replication_slots WHERE slot_name = :slot"
                ),
                {"slot": slot},
            ).first()
            keep = str(connection.execute(text("SHOW max_slot_wal_keep_size")).scalar_one())
    finally:
        engine.dispose()
    if row is None:
        return SlotState(slot, None, 0, "unknown", keep)
    return SlotState(slot, str(row[0]), int(row[1] or 0), str(row[2]), keep)
