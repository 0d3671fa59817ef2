"""The relay's PostgreSQL side: one session that holds its leases and does all its work.

The relay publishes the slices of the outbox whose *leases* it holds (rows only the relay
role may write; relay/outbox_relay/slices.py says how relays share them). It renews them
every third of ``lease_seconds``; another relay takes one once it expired, or at once when
the holder's session ended (its random marker lock left ``pg_locks``). A relay stops
sending when its own, monotonic clock says its leases may have run out (the deadline counts
from *before* the renewal was sent, so it always ends before the database's expiry).

A connection refused over TLS (an untrusted certificate, a host name not in it) raises
:class:`~outbox.core.errors.DatabaseTlsError`, which the relay does not retry: it stops with
the reason (``outbox relay run`` exits 2).

A network cut must not keep a dead leader's session alive: both ends use TCP keepalives
(idle 5 s, then 3 probes 2 s apart) and ``tcp_user_timeout`` (unacknowledged data gives up
after ``lease_seconds``), so PostgreSQL drops the session in about 11 s instead of the
operating system's 2 hours, and the client notices as well.

The session plans with ``enable_sort = off``. A read takes the lowest rows above the floor,
``ORDER BY position LIMIT n``: the position index gives them in order, and the read costs the
rows it returns. Where the planner believes the outbox small (a table never analyzed, or a
backlog that came faster than autovacuum: a fresh outbox of 100,000 rows is estimated at
14,000, and each exclusion of a read halves that) it chose to scan every row above the floor
and sort them instead, for every read: 50 to 250 ms a read at 100,000 rows, against 10 ms,
and a drain whose cost grew with the square of the backlog. A statement that cannot do
without a sort still sorts: the setting only adds to a sort's estimated cost.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import threading
import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import repeat
from typing import Any, NamedTuple

import psycopg

from outbox.core.errors import ConfigurationError
from outbox.core.tables import OutboxTables
from outbox.database_errors import database_error
from outbox_relay.cdc_watch import Offsets
from outbox_relay.slices import SLICES, Shares, describe, fair_share, plan
from outbox_relay.statements import RelayStatements

__all__ = ["Backlog", "LeaseLost", "OutboxRow", "RelayDatabase", "libpq_conninfo"]

_KEEPALIVE_IDLE_SECONDS = 5
_KEEPALIVE_INTERVAL_SECONDS = 2
_KEEPALIVE_COUNT = 3


def id_list(event_ids: Iterable[str | uuid.UUID]) -> str:
    """Event ids as the delete statement's one text parameter: UUIDs never hold a comma."""
    return ",".join(map(str, event_ids))


class _Partial(Exception):
    """A take of every slice found some taken already: undo it."""


class LeaseLost(Exception):
    """Another relay leads now, or this one's lease may have run out: step down."""


def libpq_conninfo(database_url: str) -> str:
    """``postgresql+psycopg://...`` (SQLAlchemy's form, our setting) as libpq understands it."""
    for prefix in ("postgresql+psycopg://", "postgresql://"):
        if database_url.startswith(prefix):
            return "postgresql://" + database_url[len(prefix) :]
    raise ValueError("OUTBOX_DATABASE_URL must start with postgresql+psycopg:// or postgresql://")


class OutboxRow(NamedTuple):
    """One undelivered row, its record's parts already UTF-8 bytes (see
    relay/outbox_relay/statements.py).

    A named tuple: the relay reads thousands a batch, on a thread that shares the
    interpreter with the one sending them, and a tuple costs a fraction of a dataclass."""

    id: str
    """The event id, canonical UUID text."""
    aggregate_type: str
    key: bytes
    event_type: bytes
    payload: bytes
    headers: bytes
    traceparent: bytes
    position: int


@dataclass(frozen=True, slots=True)
class Backlog:
    rows: int
    oldest_age_seconds: float
    dead_letters: int
    table_rows: dict[str, int]
    """PostgreSQL's estimate of each growing table's rows, by table name."""


class RelayDatabase:
    """One autocommit session; each statement sees its own, fresh snapshot."""

    def __init__(
        self,
        database_url: str,
        tables: OutboxTables,
        lease_seconds: float,
        balance_seconds: float = 1.0,
    ) -> None:
        self._conninfo = libpq_conninfo(database_url)
        self.statements = RelayStatements(tables)
        self.lease_seconds = lease_seconds
        self.holder = uuid.uuid4()
        """This relay's id in the lease (one per process, kept across reconnects)."""
        self._marker = 0
        self._lease_deadline = 0.0
        self._renew_due = 0.0
        self._shares_due = 0.0
        self._held: frozenset[int] = frozenset()
        self._member: int | None = None
        self._whole = False
        self.balance_seconds = min(balance_seconds, lease_seconds / 3)
        """How often a relay looks whether the shares changed (a relay joined or ended), and
        a standby renews its member lease: never less often than a third of the lease."""
        self.free_slices = 0
        """Slices no live relay held at the last look (a relay that joined or ended takes or
        leaves them within seconds; lasting, they are rows nobody delivers)."""
        self.rebalance_wanted = False
        """Set by :meth:`renew_if_due`: the shares changed, :meth:`balance` between batches."""
        self._connection: psycopg.Connection[Any] | None = None

    def connect(self) -> None:
        self.close()
        user_timeout_ms = int(self.lease_seconds * 1000)
        server_side = " ".join(
            f"-c {name}={value}"
            for name, value in (
                ("tcp_keepalives_idle", _KEEPALIVE_IDLE_SECONDS),
                ("tcp_keepalives_interval", _KEEPALIVE_INTERVAL_SECONDS),
                ("tcp_keepalives_count", _KEEPALIVE_COUNT),
                ("tcp_user_timeout", user_timeout_ms),
                # Reads walk the position index, never scan and sort the outbox (the module says).
                ("enable_sort", "off"),
            )
        )
        try:
            self._connection = psycopg.connect(
                self._conninfo,
                autocommit=True,
                application_name="outbox-relay",
                connect_timeout=5,
                keepalives=1,
                keepalives_idle=_KEEPALIVE_IDLE_SECONDS,
                keepalives_interval=_KEEPALIVE_INTERVAL_SECONDS,
                keepalives_count=_KEEPALIVE_COUNT,
                tcp_user_timeout=user_timeout_ms,
                options=server_side,
            )
        except psycopg.OperationalError as error:
            refused = database_error(error)  # TLS refused: no retry cures it (the relay stops)
            if refused is not None:
                raise refused from error
            raise
        self._lease_deadline = 0.0
        while True:  # a random key nobody else holds (a clash is astronomically rare)
            self._marker = secrets.randbits(62)
            row = self.connection.execute(
                self.statements.session_marker, (self._marker,)
            ).fetchone()
            if row and row[0]:
                break

    def close(self) -> None:
        """End the session: its leases are free for the other relays at once."""
        self._lease_deadline = 0.0
        self._held = frozenset()
        self._member = None
        self.rebalance_wanted = False
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    @property
    def connection(self) -> psycopg.Connection[Any]:
        if self._connection is None or self._connection.closed:
            raise psycopg.OperationalError("the relay's database session is closed")
        return self._connection

    # -- leases: the slices this relay publishes, its membership (relay/outbox_relay/slices.py) --

    @property
    def slices(self) -> frozenset[int]:
        """The slices whose rows this relay publishes (none: it stands by)."""
        return self._held

    def join(self, *, whole: bool = False) -> None:
        """On a new session: the lease rows made if missing, a member lease taken (none
        while :data:`MEMBERS` relays live: this one then stands by). ``whole``: this relay
        works only with every slice (auto and cleanup modes follow CDC's one stream): it
        takes all of them at once or none, and no member lease (it does not share, so the
        relays that do must not count it)."""
        self._held = frozenset()
        self._member = None
        self._whole = whole
        try:
            self.connection.execute(self.statements.lease_rows)
        except psycopg.errors.CheckViolation as error:
            raise ConfigurationError(
                "the relay's lease table knows only one leader: this relay shares the work "
                "in slices (outbox_0011). Run `outbox db upgrade`"
            ) from error
        if not whole:
            self._take_member()

    def _lease_params(self, **more: object) -> dict[str, object]:
        return {"holder": self.holder, "key": self._marker, "seconds": self.lease_seconds, **more}

    def _take(self, kind: str, count: int) -> list[int]:
        rows = self.connection.execute(
            self.statements.take, self._lease_params(kind=kind, count=count)
        ).fetchall()
        return [int(name.split(" ", 1)[1]) for (name,) in rows]

    def _take_member(self) -> None:
        taken = self._take("member", 1)
        self._member = taken[0] if taken else None

    def _renew(self) -> None:
        """Extend every lease held; LeaseLost when another relay took one of its slices."""
        sent = time.monotonic()
        names = {
            name
            for (name,) in self.connection.execute(
                self.statements.renew, self._lease_params()
            ).fetchall()
        }
        lost = sorted(n for n in self._held if f"slice {n}" not in names)
        if lost:
            self._held = frozenset()
            self._lease_deadline = 0.0
            raise LeaseLost(
                f"another relay took slices {describe(lost)}: this relay's lease ran out "
                "(database unreachable or too slow?); it joins again"
            )
        if self._member is not None and f"member {self._member}" not in names:
            self._member = None
        self._lease_deadline = sent + self.lease_seconds
        self._renew_due = sent + self.lease_seconds / 3

    def renew_if_due(self) -> None:
        """Renew the leases every third of their length; LeaseLost when another relay took
        a slice of this one. Every ``balance_seconds``, look whether the relays' shares
        changed: :attr:`rebalance_wanted` then asks the loop for :meth:`balance`."""
        now = time.monotonic()
        if now >= self._renew_due:
            self._renew()
        if now >= self._shares_due and not self.rebalance_wanted:
            self._shares_due = now + self.balance_seconds
            self.rebalance_wanted = bool(self._shares())

    def _shares(self) -> Shares:
        """What to release or take, from the live members and the free slices now."""
        if self._member is None and not self._whole:
            self._take_member()
        row = self.connection.execute(self.statements.shares).fetchone()
        members, free = (row[0], int(row[1])) if row else ([], 0)
        self.free_slices = free
        target = fair_share(members, self.holder) if self._member is not None else 0
        return plan(self._held, target, free, whole=self._whole)

    def renew_while(self, sending: threading.Event) -> None:
        """Renew the leases (and look at the shares) until ``sending`` is set: the database
        thread's wait while a batch is sent, so that a slow broker (a send may take the
        delivery timeout, longer than a lease) never lets them run out."""
        step = min(1.0, self.lease_seconds / 6)
        while not sending.wait(step):
            self.renew_if_due()

    def balance(self) -> bool:
        """Between batches (nothing in flight): hand back the slices above this relay's
        fair share, take free ones up to it (all or none when it joined ``whole``). True
        when the slices held changed (the read floor must start again)."""
        self.rebalance_wanted = False
        self._shares_due = time.monotonic() + self.balance_seconds
        self._renew()
        shares = self._shares()
        if not shares:
            return False
        held = set(self._held)
        if shares.release:
            self.connection.execute(
                self.statements.release,
                self._lease_params(names=[f"slice {n}" for n in shares.release]),
            )
            held.difference_update(shares.release)
        if shares.take:
            if self._whole:
                with contextlib.suppress(_Partial), self.connection.transaction():
                    taken = self._take("slice", shares.take)
                    if len(held) + len(taken) < SLICES:
                        raise _Partial  # another relay took some first: none, then
                    held.update(taken)
            else:
                held.update(self._take("slice", shares.take))
        changed = frozenset(held) != self._held
        # The slices free now, as this relay left them (the next look counts them anew).
        self.free_slices = max(0, self.free_slices + len(self._held) - len(held))
        self._held = frozenset(held)
        return changed

    def check_lease(self) -> None:
        """Before sending: LeaseLost when the lease may have run out (no renewal in time)."""
        if time.monotonic() >= self._lease_deadline:
            raise LeaseLost(
                f"the lease was not renewed within {self.lease_seconds:.0f} s "
                "(database unreachable?): this relay stops sending"
            )

    def release_leases(self) -> None:
        """On a clean stop: hand every slice back, so that the other relays take them at once."""
        names = [f"slice {n}" for n in self._held]
        if self._member is not None:
            names.append(f"member {self._member}")
        self._held = frozenset()
        self._member = None
        self._lease_deadline = 0.0
        if names:
            self.connection.execute(self.statements.release, self._lease_params(names=names))

    def last_position(self) -> int:
        row = self.connection.execute(self.statements.last_position).fetchone()
        assert row is not None
        return int(row[0])

    def new_xid(self) -> int:
        """A freshly assigned xid (it costs one transaction id: only when positions moved)."""
        row = self.connection.execute(self.statements.new_xid).fetchone()
        assert row is not None
        return int(row[0])

    def oldest_running_xid(self) -> int:
        row = self.connection.execute(self.statements.oldest_running_xid).fetchone()
        assert row is not None
        return int(row[0])

    def read(
        self,
        floor: int,
        limit: int,
        excluding: Sequence[tuple[str, bytes]] = (),
        in_flight: Sequence[int] = (),
    ) -> list[OutboxRow]:
        """Rows of this relay's slices above ``floor`` in position order, not those of the
        ``excluding`` aggregates
        (``(aggregate type, key)`` pairs) nor those at the positions ``in_flight`` (a batch
        being sent: still in the table, not to be read again)."""
        cursor = self.connection.cursor(binary=True)
        every = len(self._held) == SLICES
        statements = self.statements
        params: list[object] = [floor]
        if excluding or in_flight:
            statement = statements.read_excluding if every else statements.read_excluding_in_slices
            params += (
                ",".join(map(str, in_flight)),
                [aggregate_type for aggregate_type, _ in excluding],
                [key.decode() for _, key in excluding],
            )
        else:
            statement = statements.read if every else statements.read_in_slices
        if not every:
            params.append(sorted(self._held))
        params.append(limit)
        cursor.execute(statement, params)
        # tuple.__new__ over the fetched tuples: each row becomes an OutboxRow without a call
        # into Python code (OutboxRow._make would run one per row).
        return list(map(tuple.__new__, repeat(OutboxRow), cursor.fetchall()))

    def finish(
        self,
        delivered: Sequence[str],
        rejected: Sequence[tuple[str, str]],
        between: tuple[int, int],
    ) -> None:
        """Delete what the broker acknowledged; move what it refused to the dead letters.
        ``between``: the lowest and highest position of the batch (every row of it lies
        between them: the delete walks that range of the position index, nothing else).

        One transaction: a crash leaves either all of it or none of it (then the batch is
        published again, with the same event ids). With nothing refused it is the delete
        alone, one statement and so one transaction by itself (one round trip, not three).
        """
        connection = self.connection
        lowest, highest = between
        # Never a prepared statement (see RelayStatements.delete): planned with its values.
        if not rejected:
            connection.execute(
                self.statements.delete_between,
                (lowest, highest, id_list(delivered)),
                prepare=False,
            )
            return
        with connection.transaction():
            for event_id, reason in rejected:
                connection.execute(self.statements.dead_letter, (reason, event_id))
            gone = id_list([*delivered, *(event_id for event_id, _ in rejected)])
            connection.execute(
                self.statements.delete_between, (lowest, highest, gone), prepare=False
            )

    def remove_delivered(self, event_ids: Sequence[uuid.UUID], offsets: Offsets) -> int:
        """Delete rows CDC delivered and store how far its records were read, atomically.

        Returns how many rows were still there.
        """
        connection = self.connection
        with connection.transaction():
            removed = 0
            if event_ids:
                removed = connection.execute(
                    self.statements.delete, (id_list(event_ids),), prepare=False
                ).rowcount
            if offsets:
                document = json.dumps(
                    [
                        {"topic": topic, "partition": partition, "next_offset": offset}
                        for (topic, partition), offset in offsets.items()
                    ]
                )
                connection.execute(self.statements.store_offsets, (document,))
        return removed

    def cdc_offsets(self) -> Offsets:
        rows = self.connection.execute(self.statements.load_offsets).fetchall()
        return {(topic, partition): offset for topic, partition, offset in rows}

    def backlog(self) -> Backlog:
        connection = self.connection
        rows, age = connection.execute(self.statements.backlog).fetchone() or (0, 0.0)
        dead = connection.execute(self.statements.dead_letter_count).fetchone()
        estimates = connection.execute(self.statements.table_rows).fetchall()
        return Backlog(
            rows=int(rows),
            oldest_age_seconds=float(age),
            dead_letters=int(dead[0]) if dead else 0,
            table_rows={str(name): int(count) for name, count in estimates},
        )
