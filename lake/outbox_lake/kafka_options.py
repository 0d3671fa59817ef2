"""Spark's Kafka source options for the lake job's cluster."""

from __future__ import annotations

from outbox.kafka_java import java_properties
from outbox.settings import KafkaSettings

__all__ = ["spark_options"]


def spark_options(settings: KafkaSettings) -> dict[str, str]:
    """Spark's Kafka source and sink options for ``settings``: each Java client property
    prefixed ``kafka.`` (``kafka.bootstrap.servers``, ``kafka.security.protocol``,
    ``kafka.sasl.mechanism``, ``kafka.sasl.jaas.config``, ``kafka.ssl.truststore.type=PEM``
    with the certificates inline, so executors need no file...).

    Secrets are inline (Spark hands these options to its executors' consumers): never log
    the result nor show it in Spark's UI (``spark.redaction.regex`` covers ``password`` and
    ``jaas`` by default; add ``ssl.keystore.key`` to it for a client certificate).
    """
    properties = java_properties(settings, lambda _variable, value: value)
    return {f"kafka.{name}": value for name, value in properties.items()}
