"""A Kafka Connect distributed worker with Debezium's PostgreSQL connector on its class path.

Distributed mode, as in production: connector configs, source offsets and statuses live in
three compacted broker topics (``outbox-connect-configs``, ``-offsets``, ``-status``), so a
restarted worker resumes where it stopped. REST on ``127.0.0.1:<connect port>`` only.

Least privilege: the worker's process gets an allow-list of the parent's environment
(:data:`INHERITED_VARIABLES`) plus the connector's secrets (:data:`CONNECTOR_SECRETS`) and the
worker's own Kafka secrets (:data:`outbox.kafka_clients.JAVA_SECRET_VARIABLES`), never the
whole environment; and its ``EnvVarConfigProvider`` resolves ``${env:NAME}`` only for those
secrets (``allowlist.pattern``), so whoever reaches the REST API cannot read anything else (a
superuser URL, cloud keys) through a connector config.

A secured Kafka (``OUTBOX_KAFKA_SECURITY_PROTOCOL``...): the same security properties for the
worker's own clients and for each prefix of its clients (``producer.``, ``consumer.``,
``admin.``), from :func:`outbox.kafka_clients.java_client_config`; the SASL password and the
client key are ``${env:...}`` references, resolved in memory from the worker's environment,
never written in ``worker.properties`` (which is written mode 0600 all the same).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
import urllib.error
from dataclasses import dataclass

from outbox.kafka_java import JAVA_SECRET_VARIABLES, java_client_config
from outbox.settings import KafkaSettings
from outbox_connect.client import ConnectClient
from outbox_stack.artifacts import java_classpath
from outbox_stack.broker import properties_text, write_private
from outbox_stack.errors import StackError
from outbox_stack.process import ServiceProcess
from outbox_stack.settings import StackSettings

__all__ = [
    "CONNECTOR_SECRETS",
    "CONNECT_GROUP",
    "INHERITED_VARIABLES",
    "OFFSETS_TOPIC",
    "ConnectStatus",
    "ConnectWorker",
]

CONNECT_GROUP = "outbox-connect"
OFFSETS_TOPIC = f"{CONNECT_GROUP}-offsets"
"""The worker's offsets topic (``OUTBOX_CONNECT_OFFSETS_TOPIC``'s default)."""
POSTGRES_CONNECTOR = "io.debezium.connector.postgresql.PostgresConnector"
OUTBOX_EVENT_ROUTER = "io.debezium.transforms.outbox.EventRouter"
# What the JVM needs from the parent's environment; nothing else reaches the worker.
INHERITED_VARIABLES = ("PATH", "HOME", "USER", "LANG", "LC_ALL", "TZ", "TMPDIR", "JAVA_HOME")
# The only variables a connector config may read (${env:NAME}): the connector file's secrets.
CONNECTOR_SECRETS = ("OUTBOX_CONNECT_DATABASE_PASSWORD",)

_LOG4J2 = """\
status = warn
appender.console.type = Console
appender.console.name = stdout
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = info
rootLogger.appenderRef.stdout.ref = stdout
logger.reflections.name = org.reflections
logger.reflections.level = error
logger.kafkaclients.name = org.apache.kafka.clients
logger.kafkaclients.level = warn
"""


@dataclass(frozen=True)
class ConnectStatus:
    running: bool
    pid: int | None
    rest_url: str


# The worker's clients: its own (group membership, its topics), and each kind of client it
# makes for connectors and their offsets, configured by prefix.
CLIENT_PREFIXES = ("", "producer.", "consumer.", "admin.")


class ConnectWorker:
    def __init__(
        self,
        settings: StackSettings | None = None,
        *,
        bootstrap_servers: str,
        kafka: KafkaSettings | None = None,
    ) -> None:
        """``kafka``: how the worker's clients reach ``bootstrap_servers`` (its security
        settings; none by default, the local stack's broker)."""
        self.settings = settings if settings is not None else StackSettings()
        self.home = self.settings.root / "connect"
        self.process = ServiceProcess("connect", self.home, marker="ConnectDistributed")
        self.bootstrap_servers = bootstrap_servers
        self.kafka = (kafka or KafkaSettings()).with_servers(bootstrap_servers)
        self.rest_url = f"http://127.0.0.1:{self.settings.connect_port}"
        self.client = ConnectClient(self.rest_url)

    def worker_properties(self) -> dict[str, str]:
        port = str(self.settings.connect_port)
        security = java_client_config(self.kafka).properties
        security.pop("bootstrap.servers")
        if self.kafka.security_protocol == "PLAINTEXT":
            security = {}  # Kafka's default: the local stack's worker.properties stay short
        clients = {
            f"{prefix}{name}": value
            for prefix in CLIENT_PREFIXES
            for name, value in security.items()
        }
        return {
            "bootstrap.servers": self.bootstrap_servers,
            **clients,
            "group.id": CONNECT_GROUP,
            "key.converter": "org.apache.kafka.connect.storage.StringConverter",
            "value.converter": "org.apache.kafka.connect.storage.StringConverter",
            "config.storage.topic": f"{CONNECT_GROUP}-configs",
            "offset.storage.topic": OFFSETS_TOPIC,
            "status.storage.topic": f"{CONNECT_GROUP}-status",
            "config.storage.replication.factor": "1",
            "offset.storage.replication.factor": "1",
            "status.storage.replication.factor": "1",
            "offset.storage.partitions": "1",
            "status.storage.partitions": "1",
            "offset.flush.interval.ms": "1000",
            "listeners": f"http://127.0.0.1:{port}",
            "rest.advertised.host.name": "127.0.0.1",
            "rest.advertised.port": port,
            "plugin.discovery": "service_load",
            # Exactly-once source (KIP-618): each batch of source records and its source offsets
            # are one Kafka transaction, so a worker killed mid-batch leaves no duplicate for a
            # read_committed consumer (Debezium's PostgreSQL connector supports it).
            "exactly.once.source.support": "enabled",
            # Source records go out in batches of up to 256 kB gathered for 5 ms.
            "producer.linger.ms": "5",
            "producer.batch.size": "262144",
            # Short group timeouts: a restarted worker rejoins and takes its tasks back fast.
            "session.timeout.ms": "6000",
            "heartbeat.interval.ms": "1000",
            "rebalance.timeout.ms": "6000",
            "scheduled.rebalance.max.delay.ms": "0",
            # Secrets come from the worker's environment (${env:NAME} in connector configs),
            # so they are never stored in the config topic nor shown by the REST API.
            "config.providers": "env",
            "config.providers.env.class": (
                "org.apache.kafka.common.config.provider.EnvVarConfigProvider"
            ),
            "config.providers.env.param.allowlist.pattern": secrets_pattern(),
        }

    def worker_environment(self, secrets: dict[str, str]) -> dict[str, str]:
        """The worker's whole environment: the allow-listed variables, the connector's
        secrets, and the worker's Kafka secrets (referenced by its properties)."""
        unknown = set(secrets) - set(CONNECTOR_SECRETS)
        if unknown:
            raise StackError(
                f"Kafka Connect takes only {', '.join(CONNECTOR_SECRETS)} as secrets, "
                f"not {', '.join(sorted(unknown))}"
            )
        inherited = {name: os.environ[name] for name in INHERITED_VARIABLES if name in os.environ}
        return {**inherited, **secrets, **java_client_config(self.kafka).environment}

    def up(self, *, secrets: dict[str, str] | None = None) -> ConnectStatus:
        """Start if stopped; wait until REST answers and lists Debezium's plugins."""
        if not self.process.is_running():
            java = shutil.which(str(self.settings.java))
            if java is None:
                raise StackError(
                    f"Java 17 is needed for Kafka Connect ({self.settings.java} not found): "
                    "install it with `apt-get install -y openjdk-17-jre-headless` or set "
                    "OUTBOX_STACK_JAVA"
                )
            classpath = java_classpath(self.settings.downloads_root, "connect")
            self.home.mkdir(parents=True, exist_ok=True)
            properties = self.home / "worker.properties"
            write_private(properties, properties_text(self.worker_properties()))
            (self.home / "log4j2.properties").write_text(_LOG4J2)
            self.process.start(
                [
                    java,
                    f"-Xms{self.settings.connect_heap}",
                    f"-Xmx{self.settings.connect_heap}",
                    "-XX:+UseG1GC",
                    f"-Dlog4j2.configurationFile={self.home / 'log4j2.properties'}",
                    "-cp",
                    classpath,
                    "org.apache.kafka.connect.cli.ConnectDistributed",
                    str(properties),
                ],
                env=self.worker_environment(secrets or {}),
            )
        self.wait_until_ready()
        return self.status()

    def down(self) -> None:
        self.process.stop(timeout=60)

    def status(self) -> ConnectStatus:
        return ConnectStatus(self.process.is_running(), self.process.pid(), self.rest_url)

    def plugins(self) -> set[str]:
        listed = self.client.request("GET", "/connector-plugins?connectorsOnly=false")
        return {plugin["class"] for plugin in listed}

    def wait_until_ready(self) -> None:
        deadline = time.monotonic() + self.settings.connect_start_timeout_seconds
        last_error: Exception | None = None
        while time.monotonic() < deadline:
            if not self.process.is_running():
                raise StackError(
                    f"Kafka Connect exited during start-up; see {self.process.log_file}:\n"
                    + "\n".join(self.process.tail(30))
                )
            try:
                plugins = self.plugins()
                missing = {POSTGRES_CONNECTOR, OUTBOX_EVENT_ROUTER} - plugins
                if missing:
                    raise StackError(f"Kafka Connect runs without {', '.join(sorted(missing))}")
                # The worker answers REST before it has joined its group: wait for that too.
                self.client.request("GET", "/connectors")
                return
            except (urllib.error.URLError, OSError, json.JSONDecodeError) as error:
                last_error = error
                time.sleep(0.5)
        raise StackError(
            f"Kafka Connect did not answer on {self.rest_url} within "
            f"{self.settings.connect_start_timeout_seconds:.0f} s (last error: {last_error}); "
            f"see {self.process.log_file}"
        )


def secrets_pattern() -> str:
    """``allowlist.pattern`` of the worker's ``EnvVarConfigProvider``: the secrets, exactly
    (the connector's, and the worker's own Kafka secrets its properties reference)."""
    names = (*CONNECTOR_SECRETS, *JAVA_SECRET_VARIABLES)
    return "^(" + "|".join(re.escape(name) for name in names) + ")$"
