"""The options every kafka-python client of ours starts from, from one
:class:`~outbox.settings.KafkaSettings`: servers, who we are, and how we prove it (TLS
context, SASL). Nobody else spells ``security_protocol`` or ``sasl_plain_password``.
Clients are opened by :func:`outbox.kafka_clients.open_client`; Java clients (Kafka
Connect, Spark) get their properties from :mod:`outbox.kafka_java`."""

from __future__ import annotations

import ssl
from typing import Any

from outbox.core.errors import ConfigurationError
from outbox.settings import KafkaSettings

__all__ = ["client_options", "ssl_context"]


def _no_password() -> str:
    raise ConfigurationError(
        "OUTBOX_KAFKA_SSL_KEYFILE is encrypted: give its password in "
        "OUTBOX_KAFKA_SSL_KEY_PASSWORD or OUTBOX_KAFKA_SSL_KEY_PASSWORD_FILE"
    )


def ssl_context(settings: KafkaSettings) -> ssl.SSLContext | None:
    """The TLS context of every kafka-python client (and of :func:`check_login`): the brokers'
    certificates verified against ``OUTBOX_KAFKA_SSL_CAFILE`` (or the system's authorities),
    their host names checked unless ``OUTBOX_KAFKA_SSL_CHECK_HOSTNAME=false``, our client
    certificate when one is set. ``None`` without TLS."""
    if not settings.uses_tls:
        return None
    try:
        context = ssl.create_default_context(
            cafile=None if settings.ssl_cafile is None else str(settings.ssl_cafile)
        )
    except (ssl.SSLError, OSError) as error:
        raise ConfigurationError(
            f"OUTBOX_KAFKA_SSL_CAFILE={settings.ssl_cafile} holds no usable PEM certificate "
            f"({error}): give the certificate authority's certificate, PEM"
        ) from None
    context.check_hostname = settings.ssl_check_hostname
    context.verify_mode = ssl.CERT_REQUIRED  # the chain is verified even without host names
    if settings.ssl_certfile is not None:
        password = settings.ssl_key_password
        try:
            context.load_cert_chain(
                str(settings.ssl_certfile),
                None if settings.ssl_keyfile is None else str(settings.ssl_keyfile),
                # Never None: OpenSSL would prompt on the terminal for an encrypted key's
                # password, and a service would wait there for ever.
                password=_no_password if password is None else password.get_secret_value(),
            )
        except (ssl.SSLError, OSError) as error:
            raise ConfigurationError(
                f"the client certificate OUTBOX_KAFKA_SSL_CERTFILE={settings.ssl_certfile} "
                f"with OUTBOX_KAFKA_SSL_KEYFILE={settings.ssl_keyfile} cannot be loaded "
                f"({error}): give a PEM certificate and its PEM key; if the key is encrypted, "
                "its password in OUTBOX_KAFKA_SSL_KEY_PASSWORD(_FILE)"
            ) from None
    return context


def client_options(settings: KafkaSettings, *, client_id: str) -> dict[str, Any]:
    """The options every kafka-python client of ours starts from (consumer, producer, admin):
    the servers, who we are, and how we prove it. (Consumers and producers add
    ``metrics_enabled=False``: kafka-python's per-topic metric names collide for ``a.b`` and
    ``a_b``; its admin client has no such option.)"""
    options: dict[str, Any] = {
        "bootstrap_servers": settings.servers,
        "client_id": client_id,
        "security_protocol": settings.security_protocol,
    }
    context = ssl_context(settings)
    if context is not None:
        options["ssl_context"] = context
    if settings.uses_sasl:
        assert settings.sasl_password is not None  # checked by the settings
        options["sasl_mechanism"] = settings.sasl_mechanism
        options["sasl_plain_username"] = settings.sasl_username
        options["sasl_plain_password"] = settings.sasl_password.get_secret_value()
    return options
