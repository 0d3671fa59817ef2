"""The Debezium connector of the CDC path: its configuration, and applying it through Kafka
Connect's REST API. ``outbox-connector.json`` is the one connector file, used by the native
stack and by docker-compose alike; ``{{name}}`` placeholders are filled from settings.
"""

from outbox_connect.client import ConnectClient, ConnectError
from outbox_connect.config import render_connector_config
from outbox_connect.settings import ConnectorSettings

__all__ = ["ConnectClient", "ConnectError", "ConnectorSettings", "render_connector_config"]
