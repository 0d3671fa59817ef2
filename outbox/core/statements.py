"""SQL text for every statement the SDK runs. Builds statements; never runs them.

Templates use psycopg's ``%(name)s`` parameters; :func:`to_named_style` gives the ``:name``
form SQLAlchemy's ``text()`` takes. A batch of two or more events is one statement whose
rows travel as a single JSON array parameter, taken apart by ``jsonb_to_recordset``; one event
is a plain ``INSERT ... VALUES`` (measured faster for one row: benchmarks/sdk_publish.py).
"""

from __future__ import annotations

import enum
import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from json.encoder import encode_basestring_ascii
from typing import Any, NamedTuple

from outbox.core.tables import OutboxTables

__all__ = [
    "ROW_PARAMETERS",
    "EventRow",
    "OutboxStatements",
    "Result",
    "Statement",
    "encode_batch",
    "to_named_style",
]

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


_COLUMNS = "id, aggregatetype, aggregateid, type, payload, headers, traceparent"
_RECORD = (
    "id uuid, aggregatetype text, aggregateid text, type text, payload jsonb, headers jsonb, "
    "traceparent text, dedup_key text"
)
# The whole batch is one jsonb parameter: one short statement text for every batch size,
# cheap to bind on the client and to parse on the server, and prepared after a few uses.
_BATCH_TEMPLATE = (
    f"ROWS FROM (jsonb_to_recordset(CAST({{batch}} AS jsonb)) AS ({_RECORD}))\n"
    "    WITH ORDINALITY AS batch(id, aggregatetype, aggregateid, type, payload, headers,\n"
    "                             traceparent, dedup_key, ord)"
)
_BATCH = _BATCH_TEMPLATE.format(batch="%(batch)s")
_LEADING_WITH = re.compile(r"\s*WITH\s", re.IGNORECASE)


def _with_insert(query: str, insert: str) -> str:
    leading_with = _LEADING_WITH.match(query)
    if leading_with is not None:
        return f"WITH outbox_events AS ({insert}),\n{query[leading_with.end() :]}"
    return f"WITH outbox_events AS ({insert})\n{query}"


# The values of one row, in column order: the parameter names of the one-row statements.
ROW_PARAMETERS = ("id", "aggregatetype", "aggregateid", "type", "payload", "headers", "traceparent")


class EventRow(NamedTuple):
    """One outbox row as bound into SQL: payload and headers already JSON text.

    A named tuple: built for every event published, and a tuple is built in C where a
    frozen dataclass sets each field through Python."""

    event_id: Any
    aggregate_type: str
    aggregate_id: str
    event_type: str
    payload: str
    headers: str
    traceparent: str | None
    dedup_key: str | None

    def values(self) -> tuple[Any, ...]:
        """The row's values for the one-row statements, in :data:`ROW_PARAMETERS` order."""
        return self[: len(ROW_PARAMETERS)]


def _quoted(text: str | None) -> str:
    return "null" if text is None else encode_basestring_ascii(text)


def encode_batch(rows: Sequence[EventRow]) -> str:
    """The rows as the JSON array the statements take apart (payloads embedded as they are)."""
    return (
        "["
        + ",".join(
            f'{{"id":"{row.event_id}","aggregatetype":{_quoted(row.aggregate_type)},'
            f'"aggregateid":{_quoted(row.aggregate_id)},"type":{_quoted(row.event_type)},'
            f'"payload":{row.payload},"headers":{row.headers},'
            f'"traceparent":{_quoted(row.traceparent)},"dedup_key":{_quoted(row.dedup_key)}}}'
            for row in rows
        )
        + "]"
    )


@dataclass(frozen=True)
class OutboxStatements:
    """All SQL of the SDK for one set of table names."""

    tables: OutboxTables

    @cached_property
    def insert_event(self) -> str:
        """Insert one row (the commonest publish): plain VALUES, the shape a hand-written
        INSERT has, which the server plans and runs faster than taking a batch apart."""
        return self._insert_values(tuple(f"%({name})s" for name in ROW_PARAMETERS))

    @cached_property
    def insert_event_positional(self) -> str:
        """:attr:`insert_event` with positional parameters (``%s``, in
        :data:`ROW_PARAMETERS` order): for psycopg, which binds a tuple with less work."""
        return self._insert_values(("%s",) * len(ROW_PARAMETERS))

    @cached_property
    def insert_events(self) -> str:
        """Insert the batch's rows in order; the table's trigger assigns their positions."""
        return (
            f"INSERT INTO {self.tables.qualified_outbox} ({_COLUMNS})\n"
            f"SELECT {_COLUMNS} FROM {_BATCH}\n"
            f"ORDER BY ord"
        )

    def with_events(self, query: str, batch_placeholder: str) -> str:
        """``query`` preceded by a data-modifying CTE that inserts the batch.

        One statement, one round trip: the events commit or roll back with the query.
        ``batch_placeholder`` is how the query's parameter style names the batch parameter.
        """
        insert = (
            f"INSERT INTO {self.tables.qualified_outbox} ({_COLUMNS})\n"
            f"SELECT {_COLUMNS} FROM {_BATCH_TEMPLATE.format(batch=batch_placeholder)}\n"
            f"ORDER BY ord"
        )
        return _with_insert(query, insert)

    def with_event(self, query: str, placeholders: Sequence[str]) -> str:
        """``query`` preceded by a data-modifying CTE that inserts one row of VALUES;
        ``placeholders`` name its values (in :data:`ROW_PARAMETERS` order) in the query's
        parameter style."""
        return _with_insert(query, self._insert_values(tuple(placeholders)))

    def _insert_values(self, placeholders: tuple[str, ...]) -> str:
        if len(placeholders) != len(ROW_PARAMETERS):
            raise ValueError(f"{len(ROW_PARAMETERS)} placeholders expected")
        id_, aggregate_type, aggregate_id, type_, payload, headers, traceparent = placeholders
        return (
            f"INSERT INTO {self.tables.qualified_outbox} ({_COLUMNS})\n"
            f"VALUES ({id_}, {aggregate_type}, {aggregate_id}, {type_},\n"
            f"        CAST({payload} AS jsonb), CAST({headers} AS jsonb), {traceparent})"
        )

    @cached_property
    def insert_events_with_dedup(self) -> str:
        """Insert the batch's rows, skipping those whose dedup key is live; return inserted ids.

        A key is live while its row is younger than the window. An expired key is taken over
        by the new event. Two transactions with one key: the second waits on the key's unique
        index until the first ends, then sees the conflict, so exactly one event is written.
        The key's owner and time are the server's (defaults, and a trigger since outbox_0007):
        the statement names neither.
        """
        dedup = self.tables.qualified_dedup
        return (
            f"WITH batch AS MATERIALIZED (SELECT * FROM {_BATCH}),\n"
            f"claimed AS (\n"
            f"    INSERT INTO {dedup} AS d (dedup_key, event_id)\n"
            f"    SELECT dedup_key, id FROM batch WHERE dedup_key IS NOT NULL\n"
            f"    ON CONFLICT (dedup_key) DO UPDATE\n"
            f"        SET event_id = EXCLUDED.event_id, created_at = DEFAULT\n"
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
        """A claim without a digest: names no column newer than outbox_0001."""
        return (
            f"INSERT INTO {self.tables.qualified_inbox} (consumer, message_id)\n"
            f"VALUES (%(consumer)s, %(message_id)s)\n"
            f"ON CONFLICT (consumer, message_id) DO NOTHING\n"
            f"RETURNING true"
        )

    @cached_property
    def claim_message_with_digest(self) -> str:
        """A claim that keeps the digest of what the message says (outbox_0009)."""
        return (
            f"INSERT INTO {self.tables.qualified_inbox} (consumer, message_id, digest)\n"
            f"VALUES (%(consumer)s, %(message_id)s, %(digest)s)\n"
            f"ON CONFLICT (consumer, message_id) DO NOTHING\n"
            f"RETURNING true"
        )

    @cached_property
    def claimed_digest(self) -> str:
        """The digest an existing claim keeps (run after the claim found it: a statement of
        its own, so that it sees a claim another transaction committed while the claim
        waited for it)."""
        return (
            f"SELECT digest FROM {self.tables.qualified_inbox}\n"
            f"WHERE consumer = %(consumer)s AND message_id = %(message_id)s"
        )

    @cached_property
    def dead_letter_message(self) -> str:
        return (
            f"INSERT INTO {self.tables.qualified_inbox_dead_letter}\n"
            f'  (consumer, topic, partition, "offset", event_id, key, value, headers, reason, '
            f"attempts)\n"
            f"VALUES (%(consumer)s, %(topic)s, %(partition)s, %(offset)s, %(event_id)s, %(key)s,\n"
            f"        %(value)s, CAST(%(headers)s AS jsonb), %(reason)s, %(attempts)s)\n"
            f'ON CONFLICT (consumer, topic, partition, "offset") DO UPDATE\n'
            f"SET reason = EXCLUDED.reason, attempts = EXCLUDED.attempts,\n"
            f"    failed_at = clock_timestamp()"
        )

    @cached_property
    def delete_expired_claims(self) -> str:
        return (
            f"DELETE FROM {self.tables.qualified_inbox}\n"
            f"WHERE received_at < clock_timestamp() - make_interval(secs => %(window_seconds)s)"
        )
