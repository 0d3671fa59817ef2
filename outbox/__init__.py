"""The outbox SDK: write a business row and its events in one PostgreSQL transaction.

>>> from outbox import Event, publish
>>> with Session(engine) as session, session.begin():
...     session.add(order)
...     session.flush()  # assigns order.id
...     event = Event("order", str(order.id), "OrderPlaced", {"total": order.total})
...     result = publish(session, event)
>>> result.duplicate
False

``engine`` is a SQLAlchemy engine on psycopg 3 (``postgresql+psycopg://``), ``order`` a row of
yours; ``aggregate_id`` is a ``str``. (tests/integration/test_docs.py runs this example.)
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

from outbox.core.effects import LookupAnswer
from outbox.core.errors import (
    BrokerAuthenticationError,
    BrokerAuthorizationError,
    BrokerError,
    BrokerUnavailable,
    ConfigurationError,
    ContractViolation,
    DatabaseError,
    DatabaseTlsError,
    DedupKeyUnavailableError,
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
    RecordsGoneError,
    ShortReadError,
    TransactionRequiredError,
    UnsupportedTransactionError,
)
from outbox.core.event import Event, PublishResult, new_event_id

if TYPE_CHECKING:
    from outbox._default import aclaim, apublish, apublish_many, claim, publish, publish_many
    from outbox._drivers import sqlalchemy_url
    from outbox.effects import AsyncEffects, Effects
    from outbox.inbox import AsyncInbox, Inbox
    from outbox.publisher import AsyncOutbox, Outbox
    from outbox.settings import OutboxSettings

# The adapters import SQLAlchemy, psycopg and pydantic-settings: loaded on first use, so that
# ``import outbox.core...`` (as Spark's Python workers do for every task) stays light.
_LAZY = {
    "aclaim": "outbox._default",
    "apublish": "outbox._default",
    "apublish_many": "outbox._default",
    "claim": "outbox._default",
    "publish": "outbox._default",
    "publish_many": "outbox._default",
    "sqlalchemy_url": "outbox._drivers",
    "AsyncEffects": "outbox.effects",
    "Effects": "outbox.effects",
    "AsyncInbox": "outbox.inbox",
    "Inbox": "outbox.inbox",
    "AsyncOutbox": "outbox.publisher",
    "Outbox": "outbox.publisher",
    "OutboxSettings": "outbox.settings",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'outbox' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value


__all__ = [
    "AsyncEffects",
    "AsyncInbox",
    "AsyncOutbox",
    "BrokerAuthenticationError",
    "BrokerAuthorizationError",
    "BrokerError",
    "BrokerUnavailable",
    "ConfigurationError",
    "ContractViolation",
    "DatabaseError",
    "DatabaseTlsError",
    "DedupKeyUnavailableError",
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
    "RecordsGoneError",
    "ShortReadError",
    "TransactionRequiredError",
    "UnsupportedTransactionError",
    "aclaim",
    "apublish",
    "apublish_many",
    "claim",
    "new_event_id",
    "publish",
    "publish_many",
    "sqlalchemy_url",
]
