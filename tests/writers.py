"""An application writing events while a fault happens, for the fault tests of both paths."""

from __future__ import annotations

import threading
import time
import uuid

import psycopg

from outbox import Event, Outbox


class Writer(threading.Thread):
    """Publishes batches of 10 events, like an application: on a lost connection it
    reconnects and goes on. What counts as written is read back from the outbox afterwards
    (a commit interrupted by a restart may or may not have happened)."""

    def __init__(
        self, conninfo: str, aggregate_type: str, batches: int, *, pace_seconds: float = 0.0
    ) -> None:
        super().__init__(daemon=True)
        self.conninfo = conninfo
        self.aggregate_type = aggregate_type
        self.batches = batches
        self.pace_seconds = pace_seconds
        self.done_batches = 0
        self.committed: list[uuid.UUID] = []
        """Ids of batches whose commit returned: these must arrive."""
        self.attempted: set[uuid.UUID] = set()
        """Ids of every batch tried: nothing else may arrive."""
        self.errors: list[BaseException] = []

    def run(self) -> None:
        outbox = Outbox()
        deadline = time.monotonic() + 180
        connection: psycopg.Connection | None = None
        while self.done_batches < self.batches and time.monotonic() < deadline:
            try:
                if connection is None or connection.closed:
                    connection = psycopg.connect(self.conninfo, connect_timeout=3)
                events = [
                    Event(self.aggregate_type, str(n % 7), "Written", {"n": n}) for n in range(10)
                ]
                self.attempted.update(event.event_id for event in events)
                with connection.transaction():
                    outbox.publish_many(connection, events)
                self.committed += [event.event_id for event in events]
                self.done_batches += 1
                if self.pace_seconds:
                    time.sleep(self.pace_seconds)  # a steady load, not a condition to await
            except psycopg.OperationalError:
                connection = None
                time.sleep(0.2)  # the database is restarting: retry as an application would
            except BaseException as error:
                self.errors.append(error)
                return
        if connection is not None:
            connection.close()

    def wait_for(self, batches: int, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while self.done_batches < batches:
            assert time.monotonic() < deadline, f"writer stuck at {self.done_batches} batches"
            time.sleep(0.05)
