"""SQL text for every statement the SDK runs. Builds statements; never runs them.

Templates use psycopg's ``%(name)s`` parameters; :func:`to_named_style` gives the ``:name``
form SQLAlchemy's ``text()`` takes. A batch of any size is one statement with a fixed number
of array parameters (``unnest``), so the server can keep it prepared.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from outbox.core.tables import OutboxTables

__all__ = ["OutboxStatements", "Result", "Statement", "to_named_style"]

_PYFORMAT_PARAMETER = re.compile(r"%\((\w+)\)s")


def to_named_style(sql: str) -> str:
    """Turn ``%(name)s`` parameters into ``:name`` ones."""
    return _PYFORMAT_PARAMETER.sub(r":\1", sql)


class Result(enum.Enum):
    """What the caller of a statement wants back from it."""

    NOTHING = "nothing"  # not even to wait for it, where the connection allows (pipelines)
    ROWS = "rows"
    ROWCOUNT = "rowcount"  # one row of one value: how many rows the statement touched


@dataclass(frozen=True, slots=True)
class Statement:
    """One statement to run: its text (pyformat), parameters, and what to send back."""

    sql: str
    params: dict[str, Any]
    result: Result


_BATCH = """
SELECT * FROM unnest(
    CAST(%(event_ids)s AS uuid[]),
    CAST(%(aggregate_types)s AS text[]),
    CAST(%(aggregate_ids)s AS text[]),
    CAST(%(event_types)s AS text[]),
    CAST(%(payloads)s AS jsonb[]),
    CAST(%(headers)s AS jsonb[]),
    CAST(%(traceparents)s AS text[]){extra}
) WITH ORDINALITY AS batch(id, aggregatetype, aggregateid, type, payload, headers,
                           traceparent{extra_column}, ord)
"""
_COLUMNS = "id, aggregatetype, aggregateid, type, payload, headers, traceparent"


@dataclass(frozen=True)
class OutboxStatements:
    """All SQL of the SDK for one set of table names."""

    tables: OutboxTables

    @cached_property
    def insert_events(self) -> str:
        """Insert a batch with no dedup keys. Positions are assigned by the table's trigger."""
        batch = _BATCH.format(extra="", extra_column="")
        return (
            f"INSERT INTO {self.tables.qualified_outbox} ({_COLUMNS})\n"
            f"SELECT {_COLUMNS} FROM ({batch}) AS batch ORDER BY ord"
        )

    @cached_property
    def insert_events_with_dedup(self) -> str:
        """Insert a batch, skipping events whose dedup key is live; return inserted ids.

        A key is live while its row is younger than the window. An expired key is taken over
        by the new event. Two transactions with one key: the second waits on the key's unique
        index until the first ends, then sees the conflict, so exactly one event is written.
        """
        batch = _BATCH.format(
            extra=",\n    CAST(%(dedup_keys)s AS text[])", extra_column=", dedup_key"
        )
        dedup = self.tables.qualified_dedup
        return (
            f"WITH batch AS MATERIALIZED ({batch}),\n"
            f"claimed AS (\n"
            f"    INSERT INTO {dedup} AS d (dedup_key, event_id)\n"
            f"    SELECT dedup_key, id FROM batch WHERE dedup_key IS NOT NULL\n"
            f"    ON CONFLICT (dedup_key) DO UPDATE\n"
            f"        SET event_id = EXCLUDED.event_id, created_at = clock_timestamp()\n"
            f"        WHERE d.created_at < clock_timestamp()"
            f" - make_interval(secs => %(dedup_window_seconds)s)\n"
            f"    RETURNING d.event_id\n"
            f")\n"
            f"INSERT INTO {self.tables.qualified_outbox} ({_COLUMNS})\n"
            f"SELECT {_COLUMNS} FROM batch\n"
            f"WHERE dedup_key IS NULL OR id IN (SELECT event_id FROM claimed)\n"
            f"ORDER BY ord\n"
            f"RETURNING id"
        )

    @cached_property
    def find_dedup_keys(self) -> str:
        return (
            f"SELECT dedup_key, event_id FROM {self.tables.qualified_dedup}\n"
            f"WHERE dedup_key = ANY(CAST(%(dedup_keys)s AS text[]))"
        )

    @cached_property
    def delete_expired_dedup_keys(self) -> str:
        return (
            f"DELETE FROM {self.tables.qualified_dedup}\n"
            f"WHERE created_at < clock_timestamp() - make_interval(secs => %(window_seconds)s)"
        )

    @cached_property
    def claim_message(self) -> str:
        return (
            f"INSERT INTO {self.tables.qualified_inbox} (consumer, message_id)\n"
            f"VALUES (%(consumer)s, %(message_id)s)\n"
            f"ON CONFLICT (consumer, message_id) DO NOTHING\n"
            f"RETURNING true"
        )

    @cached_property
    def delete_expired_claims(self) -> str:
        return (
            f"DELETE FROM {self.tables.qualified_inbox}\n"
            f"WHERE received_at < clock_timestamp() - make_interval(secs => %(window_seconds)s)"
        )
