"""``Inbox`` and ``AsyncInbox``: make a consumer idempotent in its own database.

``claim`` records ``(consumer, message_id)`` in the same transaction as the consumer's side
effects and says whether the message is new. Process it only when it is; a duplicate is then
skipped. If the transaction rolls back, the claim goes with it and the message can be
processed again. Several consumers claiming one id at once: exactly one gets ``True``.

With ``digest=`` (of what the message says, e.g.
:func:`outbox.core.kafka_record.content_digest` of a Kafka record), the claim keeps it, and
a copy whose digest differs from the claimed one is no duplicate: ``claim`` raises
:class:`ConflictingCopyError` (the id was reused or forged). Claims kept without a digest
(before outbox_0009, or claimed without one) match any copy. Without ``digest=`` a claim
needs no migration newer than outbox_0001; with it, outbox_0009.
"""

from __future__ import annotations

import uuid
from collections.abc import Generator
from datetime import timedelta

from outbox._drivers import async_executor, drive, drive_async, sync_executor
from outbox.core.errors import OutboxError
from outbox.core.protocol import Claim, Rows, claim_message, conflict_reason, delete_expired
from outbox.core.statements import OutboxStatements, Statement
from outbox.settings import OutboxSettings

__all__ = ["AsyncInbox", "ConflictingCopyError", "Inbox"]


class ConflictingCopyError(OutboxError):
    """A message id claimed before with another digest: a copy that says something else
    under the same id. Not a duplicate: do not process it; set it aside with the reason."""

    def __init__(self, message_id: str | uuid.UUID, consumer: str) -> None:
        super().__init__(f"consumer {consumer!r}: {conflict_reason(message_id)}")
        self.message_id = str(message_id)
        self.consumer = consumer


def _is_new(claim: Claim, message_id: str | uuid.UUID, consumer: str) -> bool:
    if claim is Claim.CONFLICT:
        raise ConflictingCopyError(message_id, consumer)
    return claim is Claim.NEW


class _InboxBase:
    def __init__(self, settings: OutboxSettings | None = None) -> None:
        self.settings = settings if settings is not None else OutboxSettings()
        self._statements = OutboxStatements(self.settings.tables)

    def _delete_expired(self, older_than: timedelta | None) -> Generator[Statement, Rows, int]:
        window = older_than if older_than is not None else self.settings.inbox_retention
        return delete_expired(self._statements.delete_expired_claims, window)


class Inbox(_InboxBase):
    """Claims for sync transactions (SQLAlchemy ``Session``/``Connection``, psycopg)."""

    def claim(
        self,
        transaction: object,
        message_id: str | uuid.UUID,
        *,
        consumer: str,
        digest: str | None = None,
    ) -> bool:
        """True when ``message_id`` is new for ``consumer``; False for a duplicate.

        With ``digest``: :class:`ConflictingCopyError` when the id was claimed with another
        digest (one more statement, on the duplicate path only).
        """
        claimed = drive(
            claim_message(self._statements, message_id, consumer, digest),
            sync_executor(transaction),
        )
        return _is_new(claimed, message_id, consumer)

    def delete_expired(self, transaction: object, older_than: timedelta | None = None) -> int:
        """Delete claims older than the retention window (``OUTBOX_INBOX_RETENTION``).

        A duplicate that arrives after its claim was deleted is processed again: keep the
        window longer than any redelivery can take.
        """
        return drive(self._delete_expired(older_than), sync_executor(transaction))


class AsyncInbox(_InboxBase):
    """The asyncio twin of :class:`Inbox`."""

    async def claim(
        self,
        transaction: object,
        message_id: str | uuid.UUID,
        *,
        consumer: str,
        digest: str | None = None,
    ) -> bool:
        """True when ``message_id`` is new for ``consumer``; False for a duplicate;
        :class:`ConflictingCopyError` when claimed with another ``digest``."""
        claimed = await drive_async(
            claim_message(self._statements, message_id, consumer, digest),
            await async_executor(transaction),
        )
        return _is_new(claimed, message_id, consumer)

    async def delete_expired(self, transaction: object, older_than: timedelta | None = None) -> int:
        """Delete claims older than the retention window (``OUTBOX_INBOX_RETENTION``)."""
        return await drive_async(
            self._delete_expired(older_than), await async_executor(transaction)
        )
