"""``Inbox`` and ``AsyncInbox``: make a consumer idempotent in its own database.

``claim`` records ``(consumer, message_id)`` in the same transaction as the consumer's side
effects and says whether the message is new. Process it only when it is; a duplicate is then
skipped. If the transaction rolls back, the claim goes with it and the message can be
processed again. Several consumers claiming one id at once: exactly one gets ``True``.
"""

from __future__ import annotations

import uuid
from collections.abc import Generator
from datetime import timedelta

from outbox._drivers import async_executor, drive, drive_async, sync_executor
from outbox.core.protocol import Rows, claim_message, delete_expired
from outbox.core.statements import OutboxStatements, Statement
from outbox.settings import OutboxSettings

__all__ = ["AsyncInbox", "Inbox"]


class _InboxBase:
    def __init__(self, settings: OutboxSettings | None = None) -> None:
        self.settings = settings if settings is not None else OutboxSettings()
        self._statements = OutboxStatements(self.settings.tables)

    def _delete_expired(self, older_than: timedelta | None) -> Generator[Statement, Rows, int]:
        window = older_than if older_than is not None else self.settings.inbox_retention
        return delete_expired(self._statements.delete_expired_claims, window)


class Inbox(_InboxBase):
    """Claims for sync transactions (SQLAlchemy ``Session``/``Connection``, psycopg)."""

    def claim(self, transaction: object, message_id: str | uuid.UUID, *, consumer: str) -> bool:
        """True when ``message_id`` is new for ``consumer``; False for a duplicate."""
        return drive(
            claim_message(self._statements, message_id, consumer), sync_executor(transaction)
        )

    def delete_expired(self, transaction: object, older_than: timedelta | None = None) -> int:
        """Delete claims older than the retention window (``OUTBOX_INBOX_RETENTION``).

        A duplicate that arrives after its claim was deleted is processed again: keep the
        window longer than any redelivery can take.
        """
        return drive(self._delete_expired(older_than), sync_executor(transaction))


class AsyncInbox(_InboxBase):
    """The asyncio twin of :class:`Inbox`."""

    async def claim(
        self, transaction: object, message_id: str | uuid.UUID, *, consumer: str
    ) -> bool:
        """True when ``message_id`` is new for ``consumer``; False for a duplicate."""
        return await drive_async(
            claim_message(self._statements, message_id, consumer),
            await async_executor(transaction),
        )

    async def delete_expired(self, transaction: object, older_than: timedelta | None = None) -> int:
        """Delete claims older than the retention window (``OUTBOX_INBOX_RETENTION``)."""
        return await drive_async(
            self._delete_expired(older_than), await async_executor(transaction)
        )
