"""The outbox SDK: write a business row and its events in one PostgreSQL transaction.

>>> from outbox import Event, publish
>>> with Session(engine) as session, session.begin():            # doctest: +SKIP
...     session.add(order)
...     publish(session, Event("order", order.id, "OrderPlaced", {"total": order.total}))
"""

from outbox._default import aclaim, apublish, apublish_many, claim, publish, publish_many
from outbox.core.effects import LookupAnswer
from outbox.core.errors import (
    ConfigurationError,
    EffectError,
    EffectNotPerformedError,
    EffectStateError,
    EventError,
    InvalidIdentifierError,
    LakeContractError,
    LakeContractWarning,
    OutboxError,
    PayloadTooLargeError,
    PayloadTypeError,
    TransactionRequiredError,
    UnsupportedTransactionError,
)
from outbox.core.event import Event, PublishResult, new_event_id
from outbox.effects import AsyncEffects, Effects
from outbox.inbox import AsyncInbox, Inbox
from outbox.publisher import AsyncOutbox, Outbox
from outbox.settings import OutboxSettings

__all__ = [
    "AsyncEffects",
    "AsyncInbox",
    "AsyncOutbox",
    "ConfigurationError",
    "EffectError",
    "EffectNotPerformedError",
    "EffectStateError",
    "Effects",
    "Event",
    "EventError",
    "Inbox",
    "InvalidIdentifierError",
    "LakeContractError",
    "LakeContractWarning",
    "LookupAnswer",
    "Outbox",
    "OutboxError",
    "OutboxSettings",
    "PayloadTooLargeError",
    "PayloadTypeError",
    "PublishResult",
    "TransactionRequiredError",
    "UnsupportedTransactionError",
    "aclaim",
    "apublish",
    "apublish_many",
    "claim",
    "new_event_id",
    "publish",
    "publish_many",
]
