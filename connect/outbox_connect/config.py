"""Render ``outbox-connector.json`` from settings. Pure: reads the template, does no I/O else."""

from __future__ import annotations

import json
import re
from pathlib import Path

from outbox.core.errors import ConfigurationError
from outbox.core.tables import cdc_heartbeat_topic
from outbox.settings import OutboxSettings
from outbox_connect.settings import ConnectorSettings

__all__ = ["TEMPLATE", "render_connector_config"]

TEMPLATE = Path(__file__).resolve().parent / "outbox-connector.json"
_PLACEHOLDER = re.compile(r"\{\{(\w+)\}\}")


def render_connector_config(
    connector: ConnectorSettings, outbox: OutboxSettings, *, template: Path = TEMPLATE
) -> dict[str, str]:
    """The connector's configuration, every ``{{name}}`` replaced; unknown names refused.
    Debezium's TLS options (``database.sslmode``, ``database.sslrootcert``) are added when
    their settings are set, and left out otherwise.

    The database password is never part of it: the worker resolves
    ``${env:OUTBOX_CONNECT_DATABASE_PASSWORD}`` from its own environment (Kafka's
    ``EnvVarConfigProvider``), so the secret is neither stored in Connect's config topic nor
    returned by its REST API.
    """
    tables = outbox.tables
    values = {
        "database_host": connector.database_host,
        "database_port": str(connector.database_port),
        "database_name": connector.database_name,
        "database_user": connector.database_user,
        "topic_prefix": connector.topic_prefix,
        "slot_name": connector.slot_name,
        "heartbeat_interval_ms": str(connector.heartbeat_interval_ms),
        "publication": outbox.publication,
        "schema": tables.schema,
        "table": tables.outbox,
        "heartbeat_table": tables.heartbeat,
        # Kafka's TopicNameMatches takes a Java regex, which reads re.escape's escapes alike.
        "heartbeat_topic_pattern": re.escape(cdc_heartbeat_topic(connector.topic_prefix, tables)),
    }
    raw: dict[str, str] = json.loads(template.read_text())

    def fill(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in values:
            raise ConfigurationError(
                f"{template.name} uses {{{{{name}}}}}, which no setting provides: "
                f"remove it from the file or use one of {', '.join(sorted(values))}"
            )
        return values[name]

    config = {key: _PLACEHOLDER.sub(fill, value) for key, value in raw.items()}
    return {**config, **_tls_config(connector)}


def _tls_config(connector: ConnectorSettings) -> dict[str, str]:
    """Debezium's TLS options for the settings that are set (the others stay Debezium's)."""
    options = {
        "database.sslmode": connector.database_sslmode,
        "database.sslrootcert": connector.database_sslrootcert,
    }
    return {key: value for key, value in options.items() if value is not None}
