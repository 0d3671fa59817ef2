"""The one error hierarchy of the project: a root and a subclass per failure domain.

Every error a user can meet on purpose is an :class:`OutboxError`, whichever package raises
it (the SDK, the relay, the lake, Connect's client, the local stack): the ``outbox`` command
turns each into one readable line (``--verbose`` adds the traceback), and an application can
catch the root. A subclass keeps the built-in base its callers used to catch (``ValueError``
for bad input, ``TimeoutError`` for a deadline), so narrowing an ``except`` stays optional.

Tree (domain, then condition)::

    OutboxError
    ├── ConfigurationError (ValueError)          a setting or argument is invalid
    │   └── InvalidIdentifierError                 a SQL name from configuration
    ├── EventError (ValueError)                  an event the SDK is asked to write
    │   ├── LakeContractError                      a payload the lake would set aside
    │   └── DedupKeyUnavailableError               a dedup key held by another database role
    ├── PayloadTypeError (TypeError), PayloadTooLargeError (ValueError)
    ├── TransactionRequiredError, UnsupportedTransactionError (TypeError)
    ├── ContractViolation (ValueError)           a record on Kafka that breaks the contract
    ├── DataLossError (RuntimeError)             records the lake had not read are gone
    ├── DeliveryTimeoutError (TimeoutError)      events did not arrive within a deadline
    ├── LakeStorageError                         the lake's object store refused or did not answer
    ├── BrokerError                              Kafka refused what a client of ours asked
    │   ├── BrokerUnavailable                      Kafka did not answer
    │   ├── BrokerAuthenticationError              who we are was refused (TLS, SASL)
    │   ├── BrokerAuthorizationError               an operation outside our ACLs
    │   ├── RecordsGoneError                       records deleted under a reader
    │   └── ShortReadError                         a partition not read to the end it was given
    ├── DatabaseError                            PostgreSQL refused a connection
    │   └── DatabaseTlsError                       TLS as the client asks for it failed
    ├── ConnectError                             Kafka Connect refused or did not answer
    ├── StackError                               a local service would not install/start/stop
    └── EffectError                              the side-effect ledger
        ├── EffectNotPerformedError
        └── EffectStateError

Standard library only: the packages that raise these re-export them where they always were
(``outbox.core.contract.ContractViolation``, ``outbox_stack.errors.StackError``, ...).
"""

from __future__ import annotations

__all__ = [
    "BrokerAuthenticationError",
    "BrokerAuthorizationError",
    "BrokerError",
    "BrokerUnavailable",
    "ConfigurationError",
    "ConnectError",
    "ContractViolation",
    "DataLossError",
    "DatabaseError",
    "DatabaseTlsError",
    "DedupKeyUnavailableError",
    "DeliveryTimeoutError",
    "EffectError",
    "EffectNotPerformedError",
    "EffectStateError",
    "EventError",
    "InvalidIdentifierError",
    "LakeContractError",
    "LakeContractWarning",
    "LakeStorageError",
    "OutboxError",
    "PayloadTooLargeError",
    "PayloadTypeError",
    "RecordsGoneError",
    "ShortReadError",
    "StackError",
    "TransactionRequiredError",
    "UnsupportedTransactionError",
]


class OutboxError(Exception):
    """Root of every error this project raises on purpose."""


class ConfigurationError(OutboxError, ValueError):
    """A setting is missing or invalid; the message names the setting and the fix."""


class InvalidIdentifierError(ConfigurationError):
    """A schema, table or other SQL name from configuration is not a plain identifier."""


class EventError(OutboxError, ValueError):
    """An event field (aggregate type, aggregate id, event type, header...) is invalid."""


class LakeContractError(EventError):
    """A payload the lake's typed table would set aside (``OUTBOX_LAKE_CONTRACT=strict``);
    ``problems`` lists every reason, each naming the field and the fix."""

    def __init__(self, message: str, *, problems: list[str]) -> None:
        super().__init__(message)
        self.problems = problems


class DedupKeyUnavailableError(EventError):
    """The event's dedup key is live but not this role's: another service's role holds it
    (keys belong to the role that wrote them), or it expired and was deleted at that very
    moment. The event was not written; the caller's transaction should roll back."""


class LakeContractWarning(UserWarning):
    """The same finding as :class:`LakeContractError`, as a warning
    (``OUTBOX_LAKE_CONTRACT=warn``, the default): turn it into an error in your test suite
    with ``-W error::outbox.LakeContractWarning``."""


class PayloadTypeError(OutboxError, TypeError):
    """A payload value cannot be encoded as JSON; ``path`` names where it is."""

    def __init__(self, message: str, *, path: str) -> None:
        super().__init__(message)
        self.path = path


class PayloadTooLargeError(OutboxError, ValueError):
    """The encoded payload is larger than the configured maximum."""

    def __init__(self, message: str, *, size: int, limit: int) -> None:
        super().__init__(message)
        self.size = size
        self.limit = limit


class TransactionRequiredError(OutboxError):
    """The connection is in autocommit mode or not inside a transaction.

    An outbox event written there would be atomic with nothing, so it is refused.
    """


class UnsupportedTransactionError(OutboxError, TypeError):
    """The object passed as the transaction is not one the SDK knows how to use."""


class EffectError(OutboxError):
    """The side-effect ledger (``outbox.effects``) was misused or is in an unexpected state."""


class EffectNotPerformedError(EffectError):
    """Raise it from an effect's call when the third party certainly did not act.

    For example a refused connection, or a 4xx answer that rejects the request. The step is
    then released: the next attempt calls again (with the same idempotency key). Any other
    exception leaves the step *started*: it is never called again blindly.
    """


class EffectStateError(EffectError):
    """An operator's decision names a step that does not exist or needs no decision."""


class ContractViolation(OutboxError, ValueError):
    """A record on an outbox topic that does not follow the contract (the reason says how).

    Consumers and the lake set such a record aside with the reason; it never stops a stream.
    """


class DataLossError(OutboxError, RuntimeError):
    """Records the lake had not read are gone (retention, a recreated or truncated topic);
    the message names the topic-partition, the offsets and the setting that goes on."""


class DeliveryTimeoutError(OutboxError, TimeoutError):
    """Events did not arrive where they were awaited within the deadline; the message names
    what arrived, what did not, and the command that shows why."""


class LakeStorageError(OutboxError):
    """The lake's object store refused a request (credentials, permissions) or did not
    answer; the message names the store's reason and the settings to check."""


class BrokerError(OutboxError):
    """Kafka refused what one of our readers asked (not authorized, an unknown topic...), or
    sent something it cannot use; the message names the servers and Kafka's reason."""


class BrokerUnavailable(BrokerError):
    """Kafka did not answer one of our readers: no broker reachable, a request timed out."""


class BrokerAuthenticationError(BrokerError):
    """Kafka did not accept who we are, and retrying will not change it: ``reason`` says
    what was refused, the message names the setting to fix.

    - ``credentials``: the SASL login (a wrong password or an unknown user: Kafka answers
      both alike, on purpose);
    - ``mechanism``: the SASL mechanism is not enabled on the listener;
    - ``untrusted_certificate``: the broker's certificate is not signed by an authority we
      trust (``OUTBOX_KAFKA_SSL_CAFILE``);
    - ``hostname``: the broker's certificate names another host;
    - ``client_certificate``: the broker refused our client certificate (or wanted one);
    - ``tls``: the TLS session failed otherwise (a protocol or cipher mismatch...).
    """

    def __init__(self, message: str, *, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class BrokerAuthorizationError(BrokerError):
    """Kafka refused an operation outside our principal's ACLs: ``resource`` (``topic``,
    ``group``, ``transactional_id``, ``cluster``) and ``names`` say what was refused."""

    def __init__(self, message: str, *, resource: str, names: str) -> None:
        super().__init__(message)
        self.resource = resource
        self.names = names


class RecordsGoneError(BrokerError):
    """The records at a reader's position were deleted (retention, a recreated topic) and
    the reader was not to skip them: ``topic``, ``partition`` and ``offset`` say where."""

    def __init__(self, message: str, *, topic: str, partition: int, offset: int) -> None:
        super().__init__(message)
        self.topic = topic
        self.partition = partition
        self.offset = offset


class ShortReadError(BrokerError):
    """A reader could not read a partition up to the end it was given: the broker stopped
    answering for it, or its records were deleted under the reader. Nothing read is reported
    as complete; ``topic``, ``partition``, ``start``, ``reached`` (the next offset the reader
    would have read) and ``end`` say where it stopped."""

    def __init__(
        self, message: str, *, topic: str, partition: int, start: int, reached: int, end: int
    ) -> None:
        super().__init__(message)
        self.topic = topic
        self.partition = partition
        self.start = start
        self.reached = reached
        self.end = end


class DatabaseError(OutboxError):
    """PostgreSQL refused a connection for a reason retrying does not cure; the message
    names the server, the reason and the fix."""


class DatabaseTlsError(DatabaseError):
    """TLS with PostgreSQL failed as the client asked for it (``sslmode=verify-full``): the
    server's certificate is not signed by a CA the client trusts (``sslrootcert``) or has
    expired, it names other hosts than the one connected to, the CA file cannot be read, or
    the server offers no TLS. ``failure`` says which (a
    :class:`outbox.core.database_tls.TlsFailure` value). Never retried by our components: it
    does not pass by itself, and it is what a server in the middle looks like."""

    def __init__(self, message: str, *, failure: str) -> None:
        super().__init__(message)
        self.failure = failure


class ConnectError(OutboxError):
    """Kafka Connect refused a request or did not answer (the message gives its reason)."""


class StackError(OutboxError):
    """A local service could not be installed, started, probed or stopped."""
