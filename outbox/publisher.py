"""``Outbox`` and ``AsyncOutbox``: write events inside the caller's transaction.

The caller owns the transaction: these methods never commit, roll back or begin it. They
refuse a connection that is in autocommit mode or outside a transaction.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Generator, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from functools import lru_cache
from typing import Any

import psycopg
from psycopg import sql

from outbox._drivers import (
    async_executor,
    check_psycopg_transaction,
    drive,
    drive_async,
    sync_executor,
)
from outbox.core.errors import (
    EventError,
    LakeContractError,
    LakeContractWarning,
    UnsupportedTransactionError,
)
from outbox.core.event import Event, PublishResult
from outbox.core.lake_contract import INT64_MAX, INT64_MIN, payload_problems, scalar_problem
from outbox.core.protocol import (
    Rows,
    attached_rows,
    delete_expired,
    publish_events,
    single_row_event,
    single_row_values,
)
from outbox.core.statements import ROW_PARAMETERS, OutboxStatements, Statement, encode_batch
from outbox.settings import OutboxSettings
from outbox.tracing import creates_spans, creating

__all__ = ["AsyncOutbox", "Outbox"]


class _OutboxBase:
    def __init__(self, settings: OutboxSettings | None = None) -> None:
        self.settings = settings if settings is not None else OutboxSettings()
        self._statements = OutboxStatements(self.settings.tables)

    def _publish(self, events: list[Event]) -> Generator[Statement, Rows, list[PublishResult]]:
        self._check_lake_contract(events)
        return publish_events(
            self._statements,
            events,
            max_payload_bytes=self.settings.max_payload_bytes,
            dedup_window=self.settings.dedup_window,
        )

    def _single_row(
        self,
        connection: psycopg.Connection[Any] | psycopg.AsyncConnection[Any],
        events: list[Event],
    ) -> tuple[Event, tuple[Any, ...]] | None:
        """The commonest publish on a psycopg connection (one event, no dedup key, no span
        to make), decided without the operation's generator: the event and its row's values
        for :attr:`OutboxStatements.insert_event_positional`, after the same checks in the
        same order as :meth:`_publish`'s path. None for every other call.

        Same statement, same values, same checks: a shortcut for the Python around them,
        which cost a tenth of a one-event transaction (benchmarks/notes.md)."""
        event = single_row_event(events)
        if event is None or creates_spans():
            return None
        self._check_lake_contract(events)
        check_psycopg_transaction(connection)
        return event, single_row_values(event, max_payload_bytes=self.settings.max_payload_bytes)

    def _attach(
        self,
        connection: psycopg.Connection[Any] | psycopg.AsyncConnection[Any],
        query: str | sql.Composable,
        params: Sequence[Any] | Mapping[str, Any] | None,
        events: Iterable[Event],
    ) -> tuple[bytes, Sequence[Any] | Mapping[str, Any]]:
        """The caller's statement with our events attached, and its parameters."""
        events = list(events)
        self._check_lake_contract(events)
        rows = attached_rows(events, max_payload_bytes=self.settings.max_payload_bytes)
        text = query if isinstance(query, str) else query.as_string(connection)
        if len(rows) == 1:
            # One event: one row of VALUES, cheaper for the server than a batch to take apart.
            values = rows[0].values()
            if isinstance(params, Mapping):
                names = tuple(f"{_ROW_PARAMETER_PREFIX}{name}" for name in ROW_PARAMETERS)
                taken = sorted(set(names) & set(params))
                if taken:
                    raise EventError(f"the parameter names {taken} are the outbox's own")
                combined = self._with_event(text, tuple(f"%({name})s" for name in names))
                return combined, {**params, **dict(zip(names, values, strict=True))}
            return self._with_event(text, ("%s",) * len(values)), (*values, *(params or ()))
        batch = encode_batch(rows)
        if isinstance(params, Mapping):
            if _BATCH_PARAMETER in params:
                raise EventError(f"the parameter name {_BATCH_PARAMETER!r} is the outbox's own")
            combined = self._with_events(text, f"%({_BATCH_PARAMETER})s")
            return combined, {**params, _BATCH_PARAMETER: batch}
        return self._with_events(text, "%s"), (batch, *(params or ()))

    def _check_lake_contract(self, events: list[Event]) -> None:
        """Warn about, or refuse, payloads the lake's typed tables would set aside."""
        mode, strict_types = self.settings.lake_contract, self.settings.lake_strict_types
        if mode == "off" and not strict_types:
            return
        for event in events:
            strict = mode == "strict" or event.aggregate_type in strict_types
            if mode == "off" and not strict:
                continue
            payload = _plain_payload(event.payload)
            if _fits_lake(payload):
                continue
            problems = payload_problems(payload)
            if not problems:
                continue
            message = (
                f"event {event.event_type!r} of {event.aggregate_type!r}: the lake would keep "
                f"it in events but set its typed row aside: {'; '.join(problems)}"
            )
            if strict:
                raise LakeContractError(message, problems=problems)
            warnings.warn(message, LakeContractWarning, stacklevel=4)

    @lru_cache(maxsize=512)  # noqa: B019 - applications run a handful of statements, forever
    def _with_events(self, query: str, placeholder: str) -> bytes:
        # bytes: the caller's text plus ours (validated identifiers only), not a literal.
        return self._statements.with_events(query, placeholder).encode()

    @lru_cache(maxsize=512)  # noqa: B019 - applications run a handful of statements, forever
    def _with_event(self, query: str, placeholders: tuple[str, ...]) -> bytes:
        return self._statements.with_event(query, placeholders).encode()

    def _delete_expired_dedup_keys(self) -> Generator[Statement, Rows, int]:
        return delete_expired(
            self._statements.delete_expired_dedup_keys, self.settings.dedup_window
        )


def _creating(events: list[Event]) -> AbstractContextManager[list[Event]]:
    """:func:`creating`, or the events as they are when no span can come of it: the check is
    cheap, the no-op span it replaces was not."""
    return creating(events) if creates_spans() else nullcontext(events)


_BATCH_PARAMETER = "outbox_batch"
_ROW_PARAMETER_PREFIX = "outbox_"


def _fits_lake(payload: Any) -> bool:
    """A quick yes for the usual payload, same answer as ``not payload_problems(payload)``.

    Field names are checked once per set of names (an application has a few payload shapes);
    only the values, whose problems depend on the value, are looked at on every call.
    """
    if type(payload) is not dict and not isinstance(payload, Mapping):
        return False
    names = tuple(payload)
    if not _names_fit_lake(names):
        return False
    for name, value in payload.items():
        kind = type(value)
        if (kind is str and value.isascii()) or kind is bool or value is None:
            continue  # never a problem
        if kind is int and INT64_MIN <= value <= INT64_MAX:
            continue
        if scalar_problem(name, value) is not None:
            return False
    return True


@lru_cache(maxsize=1024)
def _names_fit_lake(names: tuple[Any, ...]) -> bool:
    # None has no scalar problem: what is left are the names' own problems and clashes.
    return not payload_problems(dict.fromkeys(names))


def _plain_payload(payload: Any) -> Any:
    """The payload's top level as the lake will see it (dataclasses and models as dicts)."""
    if type(payload) is dict or isinstance(payload, Mapping):
        return payload
    dump = getattr(payload, "model_dump", None)
    if callable(dump):
        return dump(mode="json")
    if dataclasses.is_dataclass(payload) and not isinstance(payload, type):
        return {field.name: getattr(payload, field.name) for field in dataclasses.fields(payload)}
    return payload


def _psycopg_only(transaction: object, method: str) -> None:
    if not isinstance(transaction, psycopg.Connection | psycopg.AsyncConnection):
        raise UnsupportedTransactionError(
            f"{method}() attaches events to a psycopg statement; with SQLAlchemy, "
            "use publish() or publish_many()"
        )


class Outbox(_OutboxBase):
    """Publish events through a SQLAlchemy ``Session``/``Connection`` or a psycopg ``Connection``.

    >>> outbox = Outbox()
    >>> with Session(engine) as session, session.begin():
    ...     session.add(order)
    ...     session.flush()  # assigns order.id
    ...     result = outbox.publish(session, Event("order", str(order.id), "OrderPlaced", {}))
    >>> result.duplicate
    False
    """

    def publish(self, transaction: object, event: Event) -> PublishResult:
        """Write ``event`` in ``transaction``; it commits or rolls back with it."""
        return self.publish_many(transaction, [event])[0]

    def publish_many(self, transaction: object, events: Iterable[Event]) -> list[PublishResult]:
        """Write ``events`` in one statement, in order; one result per event, in order."""
        events = list(events)
        if type(transaction) is psycopg.Connection and (
            single := self._single_row(transaction, events)
        ):
            transaction.execute(self._statements.insert_event_positional, single[1])
            return [PublishResult(single[0].event_id)]
        with _creating(events) as traced:
            return drive(self._publish(traced), sync_executor(transaction))

    def execute(
        self,
        connection: psycopg.Connection[Any],
        query: str | sql.Composable,
        params: Sequence[Any] | Mapping[str, Any] | None = None,
        *,
        events: Iterable[Event],
    ) -> psycopg.Cursor[Any]:
        """Run your own statement with ``events`` attached: one statement, one round trip.

        The events are inserted by a data-modifying CTE in front of ``query``, so they
        commit or roll back with it; the returned cursor holds your statement's results.
        psycopg connections only, inside a transaction; events with a dedup key are refused
        (use :meth:`publish`, which reports duplicates).
        """
        _psycopg_only(connection, "execute")
        check_psycopg_transaction(connection)
        with _creating(list(events)) as traced:
            statement, arguments = self._attach(connection, query, params, traced)
            return connection.execute(statement, arguments)

    def delete_expired_dedup_keys(self, transaction: object) -> int:
        """Forget dedup keys older than the window; return how many were deleted."""
        return drive(self._delete_expired_dedup_keys(), sync_executor(transaction))


class AsyncOutbox(_OutboxBase):
    """The asyncio twin of :class:`Outbox`, for ``AsyncSession``, ``AsyncConnection`` and
    psycopg's ``AsyncConnection``."""

    async def publish(self, transaction: object, event: Event) -> PublishResult:
        """Write ``event`` in ``transaction``; it commits or rolls back with it."""
        return (await self.publish_many(transaction, [event]))[0]

    async def publish_many(
        self, transaction: object, events: Iterable[Event]
    ) -> list[PublishResult]:
        """Write ``events`` in one statement, in order; one result per event, in order."""
        events = list(events)
        if type(transaction) is psycopg.AsyncConnection and (
            single := self._single_row(transaction, events)
        ):
            await transaction.execute(self._statements.insert_event_positional, single[1])
            return [PublishResult(single[0].event_id)]
        with _creating(events) as traced:
            return await drive_async(self._publish(traced), await async_executor(transaction))

    async def execute(
        self,
        connection: psycopg.AsyncConnection[Any],
        query: str | sql.Composable,
        params: Sequence[Any] | Mapping[str, Any] | None = None,
        *,
        events: Iterable[Event],
    ) -> psycopg.AsyncCursor[Any]:
        """Run your own statement with ``events`` attached: one statement, one round trip."""
        _psycopg_only(connection, "execute")
        check_psycopg_transaction(connection)
        with _creating(list(events)) as traced:
            statement, arguments = self._attach(connection, query, params, traced)
            return await connection.execute(statement, arguments)

    async def delete_expired_dedup_keys(self, transaction: object) -> int:
        """Forget dedup keys older than the window; return how many were deleted."""
        return await drive_async(
            self._delete_expired_dedup_keys(), await async_executor(transaction)
        )
