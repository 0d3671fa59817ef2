"""Module-level shortcuts bound to one ``Outbox``/``Inbox`` built from the environment."""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from functools import cache

from outbox.core.event import Event, PublishResult
from outbox.inbox import AsyncInbox, Inbox
from outbox.publisher import AsyncOutbox, Outbox

__all__ = ["aclaim", "apublish", "apublish_many", "claim", "publish", "publish_many"]


@cache
def _outbox() -> Outbox:
    return Outbox()


@cache
def _async_outbox() -> AsyncOutbox:
    return AsyncOutbox(_outbox().settings)


@cache
def _inbox() -> Inbox:
    return Inbox(_outbox().settings)


@cache
def _async_inbox() -> AsyncInbox:
    return AsyncInbox(_outbox().settings)


def publish(transaction: object, event: Event) -> PublishResult:
    """:meth:`Outbox.publish` with settings from ``OUTBOX_*`` environment variables."""
    return _outbox().publish(transaction, event)


def publish_many(transaction: object, events: Iterable[Event]) -> list[PublishResult]:
    """:meth:`Outbox.publish_many` with settings from the environment."""
    return _outbox().publish_many(transaction, events)


async def apublish(transaction: object, event: Event) -> PublishResult:
    """:meth:`AsyncOutbox.publish` with settings from the environment."""
    return await _async_outbox().publish(transaction, event)


async def apublish_many(transaction: object, events: Iterable[Event]) -> list[PublishResult]:
    """:meth:`AsyncOutbox.publish_many` with settings from the environment."""
    return await _async_outbox().publish_many(transaction, events)


def claim(transaction: object, message_id: str | uuid.UUID, *, consumer: str) -> bool:
    """:meth:`Inbox.claim` with settings from the environment."""
    return _inbox().claim(transaction, message_id, consumer=consumer)


async def aclaim(transaction: object, message_id: str | uuid.UUID, *, consumer: str) -> bool:
    """:meth:`AsyncInbox.claim` with settings from the environment."""
    return await _async_inbox().claim(transaction, message_id, consumer=consumer)
