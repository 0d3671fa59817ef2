"""``Outbox`` and ``AsyncOutbox``: write events inside the caller's transaction.

The caller owns the transaction: these methods never commit, roll back or begin it. They
refuse a connection that is in autocommit mode or outside a transaction.
"""

from __future__ import annotations

from collections.abc import Generator, Iterable

from outbox._drivers import async_executor, drive, drive_async, sync_executor
from outbox.core.event import Event, PublishResult
from outbox.core.protocol import Rows, delete_expired, publish_events
from outbox.core.statements import OutboxStatements, Statement
from outbox.settings import OutboxSettings

__all__ = ["AsyncOutbox", "Outbox"]


class _OutboxBase:
    def __init__(self, settings: OutboxSettings | None = None) -> None:
        self.settings = settings if settings is not None else OutboxSettings()
        self._statements = OutboxStatements(self.settings.tables)

    def _publish(self, events: Iterable[Event]) -> Generator[Statement, Rows, list[PublishResult]]:
        return publish_events(
            self._statements,
            list(events),
            max_payload_bytes=self.settings.max_payload_bytes,
            dedup_window=self.settings.dedup_window,
        )

    def _delete_expired_dedup_keys(self) -> Generator[Statement, Rows, int]:
        return delete_expired(
            self._statements.delete_expired_dedup_keys, self.settings.dedup_window
        )


class Outbox(_OutboxBase):
    """Publish events through a SQLAlchemy ``Session``/``Connection`` or a psycopg ``Connection``.

    >>> outbox = Outbox()
    >>> with Session(engine) as session, session.begin():      # doctest: +SKIP
    ...     session.add(order)
    ...     outbox.publish(session, Event("order", order.id, "OrderPlaced", {"total": "9.90"}))
    """

    def publish(self, transaction: object, event: Event) -> PublishResult:
        """Write ``event`` in ``transaction``; it commits or rolls back with it."""
        return self.publish_many(transaction, [event])[0]

    def publish_many(self, transaction: object, events: Iterable[Event]) -> list[PublishResult]:
        """Write ``events`` in one statement, in order; one result per event, in order."""
        return drive(self._publish(events), sync_executor(transaction))

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
        return await drive_async(self._publish(events), await async_executor(transaction))

    async def delete_expired_dedup_keys(self, transaction: object) -> int:
        """Forget dedup keys older than the window; return how many were deleted."""
        return await drive_async(
            self._delete_expired_dedup_keys(), await async_executor(transaction)
        )
