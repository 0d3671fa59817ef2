"""``outbox console``: a web console for operators, on loopback unless told otherwise.

The pipeline at a glance, refreshed live (PostgreSQL and the slot, Connect and the
connector, which path delivers, the relays, the broker, the lake, reconcile's last
findings); the dead letters of the relay and the consumers, replayed or discarded when
``OUTBOX_CONSOLE_ALLOW_ACTIONS`` allows it; an event's lineage by its id. Every fact comes
from what the project already has: the CLI's own functions, the components' metrics
endpoints, the database and Kafka's admin API (:mod:`outbox_console.panels`). Security:
:mod:`outbox_console.security`; settings: :class:`~outbox_console.settings.ConsoleSettings`.
"""

from outbox_console.app import Console, create_app
from outbox_console.panels import Pipeline
from outbox_console.security import Guard, read_token
from outbox_console.settings import ConsoleSettings

__all__ = ["Console", "ConsoleSettings", "Guard", "Pipeline", "create_app", "read_token"]
