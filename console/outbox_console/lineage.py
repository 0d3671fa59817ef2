"""An event's lineage for the console: ``outbox trace``'s own
:func:`~outbox_reconcile.trace.trace_event`, lent what the console keeps.

Opening a connection and a Kafka client was most of a trace's time on a busy machine (a TLS
handshake and a password exchange with PostgreSQL; a bootstrap and the cluster's metadata
from the broker), so the console lends them: a connection from its pool, read-only for the
trace and given back; a Kafka reader from a small pool of its own, made on first use, one
trace at a time each (kafka-python's clients are not thread-safe), closed when the console
stops. A reader whose trace failed is closed, not kept: its state is not known.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sqlalchemy import Engine

    from outbox.kafka_reading import KafkaReader
    from outbox_console.panels import Pipeline
    from outbox_reconcile.trace import Lineage

__all__ = ["Tracer"]


class Tracer:
    """Traces events for the console's pages, from any thread.

    ``engine``: the console's (None: each trace opens its own connection, as the CLI);
    ``keep``: how many idle Kafka readers are kept for the next traces.
    """

    def __init__(self, pipeline: Pipeline, engine: Engine | None, *, keep: int = 2) -> None:
        self.pipeline = pipeline
        self.engine = engine
        self.keep = keep
        self._idle: list[KafkaReader] = []
        self._lock = threading.Lock()
        self._closed = False

    def trace(
        self, event_id: str, *, scan_kafka: bool = False, search_kafka: bool = True
    ) -> Lineage:
        from outbox_reconcile.run import Sources
        from outbox_reconcile.trace import trace_event

        pipeline = self.pipeline
        sources = Sources(
            database_url=pipeline.database_url,
            tables=pipeline.outbox.tables,
            kafka=pipeline.kafka,
            lake=pipeline.lake,
        )
        reader = self._borrow() if search_kafka else None
        traced = False
        try:
            with self._database() as database:
                lineage = trace_event(
                    sources,
                    event_id,
                    scan_kafka=scan_kafka,
                    search_kafka=search_kafka,
                    database=database,
                    reader=reader,
                )
            traced = True
            return lineage
        finally:
            if reader is not None:
                self._give_back(reader, keep=traced)

    def close(self) -> None:
        """Close the idle readers; one still lent is closed when it comes back."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for reader in idle:
            reader.close()

    @contextlib.contextmanager
    def _database(self) -> Iterator[Any]:
        if self.engine is None:
            yield None
            return
        with self.engine.connect() as connection:
            # Read-only while lent; the pool resets it (and rolls back) when it is given back.
            connection.execution_options(postgresql_readonly=True)
            yield connection.connection.driver_connection

    def _borrow(self) -> KafkaReader:
        from outbox_reconcile.trace import trace_reader

        with self._lock:
            if self._closed:
                raise RuntimeError("the console is stopping")
            if self._idle:
                return self._idle.pop()
        return trace_reader(self.pipeline.kafka)

    def _give_back(self, reader: KafkaReader, *, keep: bool) -> None:
        with self._lock:
            if keep and not self._closed and len(self._idle) < self.keep:
                self._idle.append(reader)
                return
        reader.close()
