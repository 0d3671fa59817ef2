"""The SQL the relay runs, as text (pure: nothing here touches a database).

Every name comes from :class:`outbox.core.tables.OutboxTables`, validated and quoted there.
"""

from __future__ import annotations

from dataclasses import dataclass

from outbox.core.tables import OutboxTables
from outbox_relay.slices import MEMBERS, SLICES

__all__ = ["RelayStatements"]

# Everything the record needs as UTF-8 bytes already (bytea, read in binary): no decoding
# to str and encoding back for every row.
_ROW_COLUMNS = (
    "id::text, aggregatetype, convert_to(aggregateid, 'UTF8'), convert_to(type, 'UTF8'), "
    "convert_to(payload::text, 'UTF8'), convert_to(headers::text, 'UTF8'), "
    "convert_to(traceparent, 'UTF8'), position"
)
_STORED_COLUMNS = "id, aggregatetype, aggregateid, type, payload, headers, traceparent, position"
_SKIP_IN_FLIGHT = " AND position NOT IN (SELECT unnest(string_to_array(%s, ',')::bigint[]))"
_IN_SLICES = (
    f" AND (hashtextextended(aggregatetype || ':' || aggregateid, 0) & {SLICES - 1}) "
    "= ANY(%s::int[])"
)
"""The rows of some slices (relay/outbox_relay/slices.py): a hash of the aggregate, computed
by the server. ``:`` never occurs in an aggregate type, so no two aggregates hash alike by
being written alike; ``& (SLICES - 1)`` keeps the low bits of a signed hash."""
_ALIVE = (
    "alive AS MATERIALIZED (SELECT pid, (classid::bigint << 32) | objid::bigint AS marker "
    "FROM pg_catalog.pg_locks WHERE locktype = 'advisory' AND granted AND objsubid = 1)"
)
"""The sessions' marker locks (:attr:`RelayStatements.session_marker`), read once a statement:
enough to count (:attr:`RelayStatements.shares`), not to take (see :func:`_live`)."""


def _live(lease: str, *, now: bool = False) -> str:
    """The lease row ``lease`` is held: not expired, and its holder's session still runs.

    ``now``: the holder's marker lock looked up in ``pg_locks`` each time the row is
    checked, for :attr:`RelayStatements.take`: a row another relay took while this statement
    waited for its lock is checked again, against the locks as they are then (``alive``,
    read once at the start, would not know that relay's session if it began meanwhile)."""
    if now:
        alive = (
            "SELECT 1 FROM pg_catalog.pg_locks a WHERE a.locktype = 'advisory' AND a.granted "
            f"AND a.objsubid = 1 AND a.pid = {lease}.pid "
            f"AND ((a.classid::bigint << 32) | a.objid::bigint) = {lease}.marker"
        )
    else:
        alive = f"SELECT 1 FROM alive a WHERE a.pid = {lease}.pid AND a.marker = {lease}.marker"
    return f"({lease}.expires_at > clock_timestamp() AND EXISTS ({alive}))"


_SKIP_WAITING = (
    " AND (aggregatetype, aggregateid) NOT IN (SELECT * FROM unnest(%s::text[], %s::text[]))"
)


@dataclass(frozen=True)
class RelayStatements:
    tables: OutboxTables

    @property
    def session_marker(self) -> str:
        """Take this session's marker lock (``%s``: a random bigint key).

        It proves the session alive to the other relays (``pg_locks``): when the session
        ends, the lock goes, and its leases may be taken at once instead of waited out. Any
        role sees the key in ``pg_locks``, but a lease counts it only for its own backend's
        pid: another session holding the same key proves nothing.
        """
        return "SELECT pg_try_advisory_lock(%s)"

    @property
    def lease_rows(self) -> str:
        """Every slice's and member's lease row, free, unless there already
        (relay/outbox_relay/slices.py)."""
        return (
            f"INSERT INTO {self.tables.qualified_relay_lease} "
            "(name, holder, pid, marker, epoch, expires_at) "
            "SELECT kind || ' ' || n, '00000000-0000-0000-0000-000000000000', 0, 0, 0, "
            f"'-infinity' FROM (VALUES ('slice', {SLICES}), ('member', {MEMBERS})) "
            "k (kind, count), generate_series(0, k.count - 1) n ON CONFLICT (name) DO NOTHING"
        )

    @property
    def take(self) -> str:
        """Take up to ``%(count)s`` free leases of one kind (``%(kind)s``: ``slice`` or
        ``member``), lowest numbers first; returns their names.

        ``%(holder)s``: this relay's id, ``%(key)s``: its session marker, ``%(seconds)s``:
        the lease's length. A lease is free when it expired or its holder's session ended
        (its marker lock is gone); none is while a relay of an earlier version leads (a live
        ``leader`` row, outbox_0011). Rows another relay is taking are waited for, then
        checked again (so two relays taking every slice at once do not each get half, give
        them back and try again in step); every relay locks them in the same order.
        Only the relay role may write the lease table: no other role can take or freeze the
        work.
        """
        lease = self.tables.qualified_relay_lease
        return (
            f"WITH free AS (SELECT l.name FROM {lease} l "
            "WHERE starts_with(l.name, %(kind)s || ' ') AND NOT " + _live("l", now=True) + " "
            f"AND NOT EXISTS (SELECT 1 FROM {lease} o WHERE o.name = 'leader' AND "
            + _live("o", now=True)
            + ") ORDER BY split_part(l.name, ' ', 2)::int LIMIT %(count)s "
            "FOR UPDATE OF l) "
            f"UPDATE {lease} l SET holder = %(holder)s::uuid, pid = pg_backend_pid(), "
            "marker = %(key)s, epoch = l.epoch + 1, "
            "expires_at = clock_timestamp() + %(seconds)s * interval '1 second' "
            "FROM free WHERE l.name = free.name RETURNING l.name"
        )

    @property
    def renew(self) -> str:
        """Extend every lease this session holds (``%(holder)s``, ``%(key)s``, ``%(seconds)s``
        as :attr:`take`); returns their names: one missing was taken by another relay.

        A lease that expired is extended too while it still names this session: nobody took
        it meanwhile (a take writes its own holder, pid and marker), so nobody sent its
        rows. One handed back (``-infinity``) is not."""
        return (
            f"UPDATE {self.tables.qualified_relay_lease} "
            "SET expires_at = clock_timestamp() + %(seconds)s * interval '1 second' "
            "WHERE holder = %(holder)s::uuid AND pid = pg_backend_pid() AND marker = %(key)s "
            "AND name <> 'leader' AND expires_at > '-infinity' RETURNING name"
        )

    @property
    def shares(self) -> str:
        """The live members' ids and how many slices are free (as :attr:`take` counts them)."""
        lease = self.tables.qualified_relay_lease
        return (
            f"WITH {_ALIVE} SELECT "
            f"ARRAY(SELECT l.holder FROM {lease} l WHERE starts_with(l.name, 'member ') AND "
            + _live("l")
            + f"), (SELECT count(*) FROM {lease} l WHERE starts_with(l.name, 'slice ') "
            "AND NOT "
            + _live("l")
            + f" AND NOT EXISTS (SELECT 1 FROM {lease} o WHERE o.name = 'leader' AND "
            + _live("o")
            + "))"
        )

    @property
    def release(self) -> str:
        """Hand back this session's leases named in ``%(names)s`` (a text array), at once."""
        return (
            f"UPDATE {self.tables.qualified_relay_lease} SET expires_at = '-infinity' "
            "WHERE name = ANY(%(names)s::text[]) AND holder = %(holder)s::uuid "
            "AND pid = pg_backend_pid()"
        )

    @property
    def last_position(self) -> str:
        """The last position drawn (0 before the first): read before :attr:`snapshot_bounds`.

        A fresh sequence says ``last_value = 1`` with ``is_called = false``: 1 is not drawn yet.
        """
        return (
            "SELECT CASE WHEN is_called THEN last_value ELSE last_value - 1 END "
            f"FROM {self.tables.qualified_position_sequence}"
        )

    @property
    def new_xid(self) -> str:
        """An xid assigned now: above every xid assigned before (a cheap, WAL-light commit)."""
        return "SELECT pg_current_xact_id()::text::bigint"

    @property
    def oldest_running_xid(self) -> str:
        return "SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint"

    def _read(self, conditions: str = "") -> str:
        """Present rows above the floor ``%s``, lowest position first, at most ``%s`` of them.

        The rows are chosen in a subquery and converted above it, so that only the rows
        returned are converted (``payload::text`` is most of a read's server time) whatever
        the plan. Flattened, a plan that scans and sorts (relay/outbox_relay/database.py says
        when the planner took one) converted every row above the floor before the sort kept
        ``n``: 150 to 250 ms a read of 100,000 rows.
        """
        return (
            f"SELECT {_ROW_COLUMNS} FROM (SELECT {_STORED_COLUMNS} "
            f"FROM {self.tables.qualified_outbox} WHERE position > %s{conditions} "
            "ORDER BY position LIMIT %s) o ORDER BY position"
        )

    @property
    def read(self) -> str:
        """Present (undelivered) rows above the floor ``%s``, lowest position first (``%s``
        of them at most)."""
        return self._read()

    @property
    def read_excluding(self) -> str:
        """:attr:`read`, leaving out the rows in flight (``%s``: their positions, comma-separated
        in one text parameter, as :attr:`delete`'s ids) and the aggregates that wait
        (``%s`` types[], ``%s`` ids[]).

        Both are left out by the server (hashed subplans): the rows in flight, a whole batch
        while the next is read, are neither converted, sent nor turned into Python objects.
        """
        return self._read(_SKIP_IN_FLIGHT + _SKIP_WAITING)

    @property
    def read_in_slices(self) -> str:
        """:attr:`read` of some slices only (``%s`` before the limit: their numbers, int[])."""
        return self._read(_IN_SLICES)

    @property
    def read_excluding_in_slices(self) -> str:
        """:attr:`read_excluding` of some slices only (as :attr:`read_in_slices`)."""
        return self._read(_SKIP_IN_FLIGHT + _SKIP_WAITING + _IN_SLICES)

    @property
    def delete(self) -> str:
        """The rows whose ids are in one comma-separated text parameter (one string to send
        instead of an array of thousands of values to encode one by one: see ``id_list``).

        Run it unprepared (``prepare=False``): planned with its values, the ids become one
        constant array, parsed once and hashed. A prepared statement's generic plan keeps
        ``string_to_array(%s)`` an expression, and where the plan tests it row by row (a
        filter beside an index range scan: the planner chose one now and then) it parses
        every id again for each row: 5,000 x 5,000 ids, 1.5 to 2 s a batch (seen in the
        benchmark, where it cost the relay its lease)."""
        return (
            f"DELETE FROM {self.tables.qualified_outbox} "
            "WHERE id = ANY(string_to_array(%s, ',')::uuid[])"
        )

    @property
    def delete_between(self) -> str:
        """:attr:`delete` for rows known to lie between two positions (``%s`` and ``%s``, then
        the ids): the server walks the position index over that range only. Without the
        bounds it chose, on a large outbox never analyzed, a sequential scan of the whole
        table for each batch (its cost grew with the backlog, not with the batch). Run it
        unprepared, as :attr:`delete`."""
        return (
            f"DELETE FROM {self.tables.qualified_outbox} WHERE position BETWEEN %s AND %s "
            "AND id = ANY(string_to_array(%s, ',')::uuid[])"
        )

    @property
    def dead_letter(self) -> str:
        """Move one row to the dead letters with its reason (the caller deletes it)."""
        return (
            f"INSERT INTO {self.tables.qualified_dead_letter} "
            "(id, aggregatetype, aggregateid, type, payload, headers, traceparent, position, "
            "created_at, reason) "
            "SELECT id, aggregatetype, aggregateid, type, payload, headers, traceparent, "
            f"position, created_at, %s FROM {self.tables.qualified_outbox} WHERE id = %s::uuid "
            "ON CONFLICT (id) DO UPDATE SET reason = EXCLUDED.reason, failed_at = clock_timestamp()"
        )

    @property
    def load_offsets(self) -> str:
        return f"SELECT topic, partition, next_offset FROM {self.tables.qualified_relay_offset}"

    @property
    def store_offsets(self) -> str:
        """``%s``: a JSON array of ``{"topic", "partition", "next_offset"}``."""
        return (
            f"INSERT INTO {self.tables.qualified_relay_offset} AS o "
            "(topic, partition, next_offset) "
            "SELECT topic, partition, next_offset FROM jsonb_to_recordset(%s::jsonb) "
            "AS r(topic text, partition integer, next_offset bigint) "
            "ON CONFLICT (topic, partition) DO UPDATE SET next_offset = "
            "greatest(o.next_offset, EXCLUDED.next_offset)"
        )

    @property
    def backlog(self) -> str:
        """Undelivered rows, and the age in seconds of the oldest.

        The oldest is the lowest position (the position index: no scan of ``created_at``, which
        has no index); positions follow insertion, so it is the oldest row but for rows of
        transactions that committed late.
        """
        return (
            f"SELECT (SELECT count(*) FROM {self.tables.qualified_outbox}), "
            "coalesce(extract(epoch FROM clock_timestamp() - "
            f"(SELECT created_at FROM {self.tables.qualified_outbox} "
            "ORDER BY position LIMIT 1)), 0)::float8"
        )

    @property
    def table_rows(self) -> str:
        """PostgreSQL's row estimates (``pg_class.reltuples``, kept by ANALYZE and autovacuum)
        of every table that grows: readable by any role, cheap, no scan."""
        names = ", ".join(
            f"'{name}'"
            for name in (
                self.tables.outbox,
                self.tables.dead_letter,
                self.tables.dedup,
                self.tables.inbox,
                self.tables.inbox_dead_letter,
                self.tables.effect,
                self.tables.heartbeat,
            )
        )
        return (
            "SELECT c.relname, greatest(c.reltuples, 0)::bigint FROM pg_catalog.pg_class c "
            "JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace "
            f"WHERE n.nspname = '{self.tables.schema}' AND c.relname IN ({names})"
        )

    @property
    def dead_letter_count(self) -> str:
        return f"SELECT count(*) FROM {self.tables.qualified_dead_letter}"

    @property
    def list_dead_letters(self) -> str:
        return (
            "SELECT id, aggregatetype, aggregateid, type, reason, failed_at, "
            f"octet_length(payload::text) FROM {self.tables.qualified_dead_letter} "
            "ORDER BY failed_at, position LIMIT %s"
        )

    @property
    def discard_dead_letters(self) -> str:
        """Delete the dead letters whose ids are in ``%s`` (an array); returns their ids."""
        return (
            f"DELETE FROM {self.tables.qualified_dead_letter} "
            "WHERE id = ANY(%s::uuid[]) RETURNING id"
        )

    @property
    def retry_dead_letters(self) -> str:
        """Put dead letters back into the outbox (a new position: they go to the end).

        ``%s`` is an array of ids, or NULL for all of them.
        """
        return (
            f"WITH moved AS (DELETE FROM {self.tables.qualified_dead_letter} "
            "WHERE %s::uuid[] IS NULL OR id = ANY(%s::uuid[]) "
            "RETURNING id, aggregatetype, aggregateid, type, payload, headers, traceparent, "
            "position) "
            f"INSERT INTO {self.tables.qualified_outbox} "
            "(id, aggregatetype, aggregateid, type, payload, headers, traceparent) "
            "SELECT id, aggregatetype, aggregateid, type, payload, headers, traceparent "
            "FROM moved ORDER BY position RETURNING id"
        )
