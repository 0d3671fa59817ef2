"""Every kafka-python client of ours is opened here, and kafka-python's errors become ours
here, once:

- :func:`open_client`: :func:`outbox.kafka_login.check_login` first (a refused login or TLS
  handshake is said within seconds, not as "Unable to bootstrap" after 30 s), then the
  client, built from :func:`outbox.kafka_options.client_options`;
- :func:`kafka_errors`: kafka-python's errors as ours (``from`` the original): a refused
  SASL login is :class:`~outbox.core.errors.BrokerAuthenticationError`, an operation outside
  the principal's ACLs :class:`~outbox.core.errors.BrokerAuthorizationError` naming what was
  refused, records gone :class:`~outbox.core.errors.RecordsGoneError`, no answer
  :class:`~outbox.core.errors.BrokerUnavailable`.

Secrets leave :class:`~pydantic.SecretStr` only in the options handed to a client.
kafka-python is imported inside functions only (the ``relay`` extra).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from outbox.core.errors import (
    BrokerAuthenticationError,
    BrokerAuthorizationError,
    BrokerError,
    BrokerUnavailable,
    RecordsGoneError,
)
from outbox.kafka_login import check_login
from outbox.settings import KafkaSettings

__all__ = ["kafka_errors", "open_client"]

T = TypeVar("T")


def open_client(settings: KafkaSettings, make: Callable[..., T], options: dict[str, Any]) -> T:
    """``make(**options)`` (a kafka-python client) after :func:`check_login`, with
    kafka-python's errors as ours (:func:`kafka_errors`). A client that could not bootstrap
    is checked once more: a login refused meanwhile is said as such, not as no answer."""
    check_login(settings)
    try:
        with kafka_errors(settings):
            return make(**options)
    except BrokerUnavailable:
        check_login(settings)
        raise


def _names(error: Exception) -> str:
    found = error.args[0] if error.args else ""
    if isinstance(found, set | frozenset | list | tuple):
        return ", ".join(sorted(str(name) for name in found))
    return str(found)


def authorization_error(error: Exception, settings: KafkaSettings) -> BrokerAuthorizationError:
    """kafka-python's ``*AuthorizationFailedError`` as ours: which resource, by which principal."""
    from kafka import errors

    kinds: list[tuple[type[Exception], str]] = [
        (errors.TopicAuthorizationFailedError, "topic"),
        (errors.GroupAuthorizationFailedError, "group"),
        (errors.TransactionalIdAuthorizationFailedError, "transactional_id"),
        (errors.ClusterAuthorizationFailedError, "cluster"),
    ]
    resource = next((kind for cls, kind in kinds if isinstance(error, cls)), "resource")
    names = _names(error)
    who = settings.sasl_username if settings.uses_sasl else None
    principal = f"User:{who}" if who else "our principal"
    what = f"{resource} {names}" if names and resource != "cluster" else resource
    return BrokerAuthorizationError(
        f"Kafka at {settings.bootstrap_servers} refused {principal} access to {what}: not "
        f"authorized ({type(error).__name__}); grant the ACL docs/production.md lists for "
        "this component",
        resource=resource,
        names=names,
    )


@contextmanager
def kafka_errors(settings: KafkaSettings) -> Iterator[None]:
    """kafka-python's errors as ours, each ``from`` the original (see the module)."""
    from kafka import errors

    servers = settings.bootstrap_servers
    try:
        yield
    except errors.OffsetOutOfRangeError as error:
        positions = error.args[0] if error.args and isinstance(error.args[0], dict) else {}
        (topic, partition), offset = next(iter(positions.items()), (("?", -1), -1))
        raise RecordsGoneError(
            f"{topic}[{partition}]: the records from offset {offset} on are gone from Kafka "
            "(deleted by retention, or the topic was recreated)",
            topic=topic,
            partition=partition,
            offset=offset,
        ) from error
    except errors.AuthorizationError as error:
        raise authorization_error(error, settings) from error
    except (errors.SaslAuthenticationFailedError, errors.UnsupportedSaslMechanismError) as error:
        raise authentication_error(error, settings) from error
    except errors.RetriableError as error:  # timeouts, connections, no leader: no answer
        raise BrokerUnavailable(
            f"Kafka at {servers} did not answer: {type(error).__name__}: {error}"
        ) from error
    except errors.KafkaError as error:
        raise BrokerError(f"Kafka at {servers}: {type(error).__name__}: {error}") from error


def authentication_error(error: Exception, settings: KafkaSettings) -> BrokerAuthenticationError:
    """A refused SASL login as ours. Kafka answers a wrong password and an unknown user
    alike, on purpose (it does not tell who exists): the message says so."""
    from kafka import errors

    if isinstance(error, errors.UnsupportedSaslMechanismError):
        return BrokerAuthenticationError(
            f"Kafka at {settings.bootstrap_servers} does not offer SASL mechanism "
            f"{settings.sasl_mechanism} ({error}): set OUTBOX_KAFKA_SASL_MECHANISM to one "
            "its listener enables (sasl.enabled.mechanisms)",
            reason="mechanism",
        )
    return BrokerAuthenticationError(
        f"Kafka at {settings.bootstrap_servers} refused the login of user "
        f"{settings.sasl_username!r} ({settings.sasl_mechanism}): wrong password or unknown "
        f"user (Kafka does not say which; {error}); check OUTBOX_KAFKA_SASL_USERNAME and "
        "OUTBOX_KAFKA_SASL_PASSWORD(_FILE), and that the user exists for this mechanism",
        reason="credentials",
    )
