"""Everything reconcile read, in one SQLite file on disk: bounded memory, whatever the volume.

The adapters stream what they read into :class:`Evidence` in chunks; the comparison
(:mod:`outbox_reconcile.findings`) runs as SQL over it. SQLite's page cache is capped
(``cache_mb``) and its sorts spill to disk, so its memory does not grow with the events
(figures in docs/verifying-delivery.md); the file does (about 700 bytes per event: its
Kafka copy, lake row and typed row, with their indexes) and is deleted with its folder.
(Pure: stdlib only; no network, no service.)

What each table holds:

- ``outbox_rows``: the outbox's present rows in the window, with their age;
- ``dead_letters``: the relay's dead letters in the window, with their reason;
- ``kafka``: every copy of an event on the outbox topics in the window;
  ``kafka_ranges``: per partition, the offsets read ``[start, end)`` (a lake row outside it
  cannot be checked against Kafka); ``malformed``: records without a readable id;
  ``undecodable``: records no reader can take at its word (a header name that is not UTF-8);
- ``lake``: the lake's ``events`` rows in the window, each with the name of its typed table;
  ``lake_progress``: per partition, the offset the ``events`` table has taken in (the
  Delta application transaction the sink commits); ``typed``: the rows of typed tables;
  ``quarantine``: the lake's quarantine rows (all of them: they are matched by offset).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable
from itertools import islice
from pathlib import Path
from typing import Any

from outbox.core.kafka_record import Undecodable
from outbox_reconcile.records import TOPIC_PREFIX, KafkaCopy, Malformed

__all__ = ["Evidence"]

_SCHEMA = """
CREATE TABLE outbox_rows (event_id TEXT, aggregate_type TEXT, aggregate_id TEXT,
    position INTEGER, age_seconds REAL);
CREATE TABLE dead_letters (event_id TEXT, aggregate_type TEXT, aggregate_id TEXT,
    position INTEGER, reason TEXT, failed_at TEXT);
CREATE TABLE kafka (event_id TEXT, aggregate_type TEXT, aggregate_id TEXT, position INTEGER,
    topic TEXT, partition INTEGER, "offset" INTEGER, timestamp_ms INTEGER, digest TEXT);
CREATE TABLE kafka_ranges (topic TEXT, partition INTEGER, start INTEGER, "end" INTEGER,
    PRIMARY KEY (topic, partition));
CREATE TABLE malformed (topic TEXT, partition INTEGER, "offset" INTEGER, reason TEXT);
CREATE TABLE undecodable (aggregate_type TEXT, topic TEXT, partition INTEGER,
    "offset" INTEGER, reason TEXT);
CREATE TABLE lake (event_id TEXT, aggregate_type TEXT, aggregate_id TEXT, position INTEGER,
    topic TEXT, partition INTEGER, "offset" INTEGER, typed_table TEXT);
CREATE TABLE lake_progress (topic TEXT, partition INTEGER, "end" INTEGER,
    PRIMARY KEY (topic, partition));
CREATE TABLE typed (aggregate_type TEXT, typed_table TEXT, event_id TEXT);
CREATE TABLE quarantine (aggregate_type TEXT, target_table TEXT, topic TEXT,
    partition INTEGER, "offset" INTEGER, event_id TEXT, reason TEXT, in_window INTEGER);
"""

# Built once everything is in: faster than maintaining them row by row.
_INDEXES = """
CREATE INDEX kafka_event ON kafka (event_id);
CREATE INDEX kafka_place ON kafka (topic, partition, "offset");
CREATE INDEX lake_event ON lake (event_id);
CREATE INDEX typed_event ON typed (typed_table, event_id);
CREATE INDEX quarantine_place ON quarantine (topic, partition, "offset");
CREATE INDEX quarantine_event ON quarantine (target_table, event_id);
CREATE TABLE kafka_first AS
    SELECT event_id, aggregate_type, aggregate_id, position, topic, partition,
           min("offset") AS "offset", count(*) AS copies
    FROM kafka GROUP BY event_id;
CREATE INDEX kafka_first_event ON kafka_first (event_id);
CREATE TABLE lake_first AS
    SELECT event_id, aggregate_type, aggregate_id, position, topic, partition,
           min("offset") AS "offset", typed_table, count(*) AS copies
    FROM lake GROUP BY event_id;
CREATE INDEX lake_first_event ON lake_first (event_id);
"""

_CHUNK = 10_000


class Evidence:
    """The SQLite file the sources are streamed into. ``path=None``: in memory (tests)."""

    def __init__(self, path: Path | None = None, *, cache_mb: int = 64) -> None:
        self.path = path
        self.db = sqlite3.connect(":memory:" if path is None else str(path))
        self.db.execute(f"PRAGMA cache_size = -{int(cache_mb) * 1024}")
        # Sorts (GROUP BY, CREATE INDEX, window functions) spill to disk beyond this.
        self.db.execute(f"PRAGMA soft_heap_limit = {int(cache_mb) * 2 * 2**20}")
        self.db.execute("PRAGMA journal_mode = OFF")
        self.db.execute("PRAGMA synchronous = OFF")
        self.db.execute("PRAGMA temp_store = FILE")
        self.db.executescript(_SCHEMA)
        self._sealed = False

    def close(self) -> None:
        self.db.close()

    def _insert(self, table: str, columns: int, rows: Iterable[tuple[Any, ...]]) -> int:
        if self._sealed:
            raise RuntimeError("evidence is sealed: compare() was already called")
        marks = ", ".join("?" * columns)
        count = 0
        iterator = iter(rows)
        while chunk := list(islice(iterator, _CHUNK)):
            self.db.executemany(f"INSERT INTO {table} VALUES ({marks})", chunk)  # noqa: S608
            self.db.commit()  # one chunk per transaction: dirty pages never pile up
            count += len(chunk)
        return count

    # -- what the adapters hand in ------------------------------------------------------------

    def add_outbox_rows(self, rows: Iterable[tuple[str, str, str, int, float]]) -> int:
        """``(event_id, aggregate_type, aggregate_id, position, age_seconds)``"""
        return self._insert("outbox_rows", 5, rows)

    def add_dead_letters(self, rows: Iterable[tuple[str, str, str, int, str, str]]) -> int:
        """``(event_id, aggregate_type, aggregate_id, position, reason, failed_at)``"""
        return self._insert("dead_letters", 6, rows)

    def add_kafka(self, records: Iterable[KafkaCopy | Malformed]) -> int:
        copies: list[tuple[Any, ...]] = []
        bad: list[tuple[Any, ...]] = []
        for record in records:
            if isinstance(record, KafkaCopy):
                copies.append(
                    (
                        record.event_id,
                        record.aggregate_type,
                        record.aggregate_id,
                        record.position,
                        record.topic,
                        record.partition,
                        record.offset,
                        record.timestamp_ms,
                        record.digest,
                    )
                )
            else:
                bad.append((record.topic, record.partition, record.offset, record.reason))
        self._insert("malformed", 4, bad)
        return self._insert("kafka", 9, copies)

    def add_undecodable(self, records: Iterable[Undecodable]) -> int:
        return self._insert(
            "undecodable",
            5,
            (
                (r.topic.removeprefix(TOPIC_PREFIX), r.topic, r.partition, r.offset, r.reason)
                for r in records
            ),
        )

    def set_kafka_range(self, topic: str, partition: int, start: int, end: int) -> None:
        self.db.execute(
            "INSERT OR REPLACE INTO kafka_ranges VALUES (?, ?, ?, ?)",
            (topic, partition, start, end),
        )
        self.db.commit()

    def add_lake(self, rows: Iterable[tuple[str, str, str, int | None, str, int, int, str]]) -> int:
        """``(event_id, aggregate_type, aggregate_id, position, topic, partition, offset,
        typed_table)``"""
        return self._insert("lake", 8, rows)

    def set_lake_progress(self, topic: str, partition: int, end: int) -> None:
        self.db.execute(
            "INSERT OR REPLACE INTO lake_progress VALUES (?, ?, ?)", (topic, partition, end)
        )
        self.db.commit()

    def add_typed(self, aggregate_type: str, typed_table: str, event_ids: Iterable[str]) -> int:
        return self._insert(
            "typed", 3, ((aggregate_type, typed_table, event_id) for event_id in event_ids)
        )

    def add_quarantine(
        self, rows: Iterable[tuple[str, str, str, int, int, str | None, str, bool]]
    ) -> int:
        """``(aggregate_type, target_table, topic, partition, offset, event_id, reason,
        in_window)``"""
        return self._insert("quarantine", 8, rows)

    # -- for the comparison ---------------------------------------------------------------------

    def seal(self) -> None:
        """Index what was read; nothing may be added after."""
        if not self._sealed:
            self.db.executescript(_INDEXES)
            self._sealed = True

    def query(self, sql: str, parameters: tuple[Any, ...] = ()) -> sqlite3.Cursor:
        self.seal()
        return self.db.execute(sql, parameters)

    def scalar(self, sql: str, parameters: tuple[Any, ...] = ()) -> int:
        row = self.query(sql, parameters).fetchone()
        return 0 if row is None or row[0] is None else int(row[0])
