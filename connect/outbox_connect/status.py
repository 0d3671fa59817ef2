"""What ``outbox connect status`` reports, as values: the connector and its tasks, the
transactions left open on Connect's offsets topic, and the replication slot with the bound
PostgreSQL puts on the WAL it keeps.

Read here and printed elsewhere: the CLI prints :meth:`ConnectStatus.lines`, the console
(``outbox console``) shows the same values in its panels.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from outbox_connect.client import ConnectClient, ConnectorState

if TYPE_CHECKING:
    from outbox.settings import KafkaSettings
    from outbox_connect.open_transactions import OpenTransaction
    from outbox_connect.settings import ConnectorSettings

__all__ = ["ConnectStatus", "SlotState", "read_connect_status", "read_slot_state"]


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


def read_connect_status(
    settings: ConnectorSettings,
    kafka: KafkaSettings,
    database_url: str | None = None,
    *,
    timeout_seconds: float = 30,
) -> ConnectStatus:
    """The connector's and its tasks' states (Connect's REST API, each call within
    ``timeout_seconds``), the transactions open on its offsets topic, and with
    ``database_url`` the slot. Connect that cannot be reached raises
    :class:`~outbox.core.errors.ConnectError`; a broker that cannot be read leaves the
    offsets topic unchecked, with the reason."""
    from outbox.core.errors import OutboxError
    from outbox_connect.open_transactions import open_transactions

    state = ConnectClient(settings.url, timeout=timeout_seconds).state(settings.name)
    # Checked whatever the connector's state: a worker held by a hanging transaction
    # answers REST yet lists no connector.
    unchecked: str | None = None
    try:
        held = open_transactions(kafka, settings.offsets_topic)
    except OutboxError as error:  # Connect may be up while the broker is not
        unchecked, held = str(error), []
    slot = None
    if database_url is not None:
        slot = read_slot_state(database_url, settings.slot_name, timeout_seconds=timeout_seconds)
    return ConnectStatus(settings.name, state, settings.offsets_topic, held, unchecked, slot)


def read_slot_state(database_url: str, slot: str, *, timeout_seconds: float = 30) -> SlotState:
    """The slot's state and lag, and PostgreSQL's bound on the WAL it keeps (connecting and
    each statement within ``timeout_seconds``)."""
    from sqlalchemy import create_engine, text

    milliseconds = max(1, int(timeout_seconds * 1000))
    engine = create_engine(
        database_url,
        connect_args={
            "connect_timeout": max(1, round(timeout_seconds)),
            "options": f"-c statement_timeout={milliseconds}",
        },
    )
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
