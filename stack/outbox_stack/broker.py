"""The local stack's broker: Apache Kafka, one KRaft node (broker and controller), on loopback.

The same Kafka users run (the version pinned in ``outbox_stack/java/pom.xml``, from Maven
Central), durable in the stack folder: ``<stack>/kafka/data`` holds the topics, committed
offsets, transactions and Connect's topics. A ``kill -9`` loses nothing acknowledged (the
records are in the operating system's page cache; Kafka recovers its logs at the next
start), a pause with SIGSTOP/SIGCONT loses nothing. Single node, no replication: a
development broker, not a production one.

The storage is formatted once (``kafka.tools.StorageTool format`` with a fresh cluster id and
a static controller quorum of this one node) the first time the broker starts; later starts
reuse it. Two listeners, both on 127.0.0.1: the client listener (``OUTBOX_STACK_BROKER_PORT``)
and the controller's (``OUTBOX_STACK_BROKER_CONTROLLER_PORT``).

The broker records the address it was started on next to its pid file, so the stack knows its
own broker whatever a shell exports (``OUTBOX_KAFKA_BOOTSTRAP_SERVERS`` after
``eval "$(outbox stack env)"`` names it): see :meth:`KafkaBroker.is_own`.
"""

from __future__ import annotations

import base64
import os
import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from outbox.settings import KafkaSettings
from outbox_stack.artifacts import java_classpath, java_versions
from outbox_stack.errors import StackError
from outbox_stack.process import ServiceProcess
from outbox_stack.settings import StackSettings

__all__ = ["BrokerSecurity", "BrokerStatus", "KafkaBroker", "properties_text", "same_servers"]

KAFKA_MAIN = "kafka.Kafka"
STORAGE_TOOL = "kafka.tools.StorageTool"
NODE_ID = 1

_LOG4J2 = """\
status = warn
appender.console.type = Console
appender.console.name = stdout
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = warn
rootLogger.appenderRef.stdout.ref = stdout
logger.raft.name = kafka.server.KafkaRaftServer
logger.raft.level = info
logger.broker.name = kafka.server.BrokerServer
logger.broker.level = info
logger.txn.name = kafka.coordinator.transaction
logger.txn.level = info
"""


def _servers(bootstrap_servers: str) -> frozenset[str]:
    found = set()
    for server in bootstrap_servers.split(","):
        host, _, port = server.strip().rpartition(":")
        host = host.strip("[]").lower()
        found.add(f"{'127.0.0.1' if host == 'localhost' else host}:{port}")
    return frozenset(found)


def properties_text(properties: Mapping[str, str]) -> str:
    """A Java ``.properties`` file: one ``key=value`` a line, a value's backslashes and line
    breaks escaped (a PEM certificate inline spans lines)."""
    return "".join(
        f"{key}={value.replace(chr(92), chr(92) * 2).replace(chr(10), chr(92) + 'n')}\n"
        for key, value in properties.items()
    )


def write_private(path: Path, text: str) -> None:
    """Write ``path`` readable by its owner only (mode 0600 from the first byte): a broker's
    or worker's properties may hold a key or a password."""
    path.unlink(missing_ok=True)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(descriptor, "w") as file:
        file.write(text)


def same_servers(first: str, second: str) -> bool:
    """Whether two bootstrap lists name the same servers (order, spaces, localhost aside)."""
    return _servers(first) == _servers(second)


def new_cluster_id() -> str:
    """A KRaft cluster id: 16 random bytes, URL-safe base64 without padding (Kafka's Uuid)."""
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()


@dataclass(frozen=True)
class BrokerStatus:
    running: bool
    pid: int | None
    bootstrap_servers: str
    data_dir: Path


@dataclass(frozen=True)
class BrokerSecurity:
    """A secured broker, from code (the test suite's, ``tests/fix_secure_kafka.py``); the
    local stack's broker has none (PLAINTEXT on loopback).

    ``client_protocol``: the security protocol of the client listener
    (``OUTBOX_STACK_BROKER_PORT``, the stack's ``bootstrap_servers``), e.g. ``SASL_SSL``.
    ``listeners``: more listeners, name → (security protocol, port), all on 127.0.0.1.
    ``inter_broker_listener`` and ``controller_protocol``: how the node talks to itself.
    ``properties``: more server properties (TLS stores, SASL mechanisms and their JAAS
    configuration, the authorizer, super users...), written to a file only its owner reads.
    ``admin``: how the stack's own admin client reaches the broker, to tell when it is ready
    (the client listener when it names no servers).
    """

    client_protocol: str
    admin: KafkaSettings
    listeners: Mapping[str, tuple[str, int]] = field(default_factory=dict)
    inter_broker_listener: str = "CLIENT"
    controller_protocol: str = "PLAINTEXT"
    properties: Mapping[str, str] = field(default_factory=dict)


class KafkaBroker:
    def __init__(
        self, settings: StackSettings | None = None, *, security: BrokerSecurity | None = None
    ) -> None:
        self.settings = settings if settings is not None else StackSettings()
        self.security = security
        self.home = self.settings.root / "kafka"
        self.data_dir = self.home / "data"
        self.process = ServiceProcess("kafka", self.home, marker=KAFKA_MAIN)
        self.address_file = self.home / "kafka.address"
        # A running broker is where it was started, whatever the settings say now.
        self.bootstrap_servers = self._running_address() or self.settings.bootstrap_servers

    def is_own(self, bootstrap_servers: str) -> bool:
        """Whether ``bootstrap_servers`` names this broker: the address it is configured for,
        or the one its running process was started on."""
        own = [self.settings.bootstrap_servers, self._running_address()]
        return any(address and same_servers(bootstrap_servers, address) for address in own)

    def _running_address(self) -> str | None:
        if not self.process.is_running():
            return None
        try:
            return self.address_file.read_text().strip() or None
        except FileNotFoundError:
            return None

    def describe(self) -> str:
        return f"Apache Kafka {java_versions()['kafka.version']}, KRaft, one node"

    def admin_settings(self) -> KafkaSettings:
        """How the stack's own clients reach this broker: the client listener, or the one
        the security's ``admin`` settings name."""
        if self.security is None:
            return KafkaSettings(bootstrap_servers=self.bootstrap_servers)
        admin = self.security.admin
        return admin if admin.bootstrap_servers else admin.with_servers(self.bootstrap_servers)

    def _listeners(self) -> dict[str, str]:
        host_port = self.bootstrap_servers
        controller = f"127.0.0.1:{self.settings.broker_controller_port}"
        if self.security is None:
            return {
                "listeners": f"PLAINTEXT://{host_port},CONTROLLER://{controller}",
                "advertised.listeners": f"PLAINTEXT://{host_port}",
                "inter.broker.listener.name": "PLAINTEXT",
                "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            }
        named = {"CLIENT": (self.security.client_protocol, host_port)}
        named.update(
            (name, (protocol, f"127.0.0.1:{port}"))
            for name, (protocol, port) in self.security.listeners.items()
        )
        advertised = ",".join(f"{name}://{address}" for name, (_, address) in named.items())
        protocols = [f"{name}:{protocol}" for name, (protocol, _) in named.items()]
        return {
            "listeners": f"{advertised},CONTROLLER://{controller}",
            "advertised.listeners": advertised,
            "inter.broker.listener.name": self.security.inter_broker_listener,
            "listener.security.protocol.map": ",".join(
                [*protocols, f"CONTROLLER:{self.security.controller_protocol}"]
            ),
        }

    def server_properties(self) -> dict[str, str]:
        controller = f"127.0.0.1:{self.settings.broker_controller_port}"
        properties = {
            "process.roles": "broker,controller",
            "node.id": str(NODE_ID),
            "controller.quorum.voters": f"{NODE_ID}@{controller}",
            **self._listeners(),
            "controller.listener.names": "CONTROLLER",
            "log.dirs": str(self.data_dir),
            # One node: every internal topic has one replica.
            "offsets.topic.replication.factor": "1",
            "offsets.topic.num.partitions": "10",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "transaction.state.log.num.partitions": "10",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            "min.insync.replicas": "1",
            # A first consumer group join is not held back waiting for more members.
            "group.initial.rebalance.delay.ms": "0",
            # The Outbox Event Router routes to a topic per aggregate type, made on first use.
            "auto.create.topics.enable": "true",
            "num.partitions": "1",
            # Retention is checked every 2 s (Kafka's default: 5 minutes), so a topic with a
            # short retention.ms loses its old records soon, as the conformance suite checks.
            "log.retention.check.interval.ms": "2000",
        }
        if self.security is not None:
            properties.update(self.security.properties)
        return properties

    def _write_configuration(self) -> Path:
        self.home.mkdir(parents=True, exist_ok=True)
        properties = self.home / "server.properties"
        write_private(properties, properties_text(self.server_properties()))
        (self.home / "log4j2.properties").write_text(_LOG4J2)
        return properties

    def _java(self) -> str:
        java = shutil.which(str(self.settings.java))
        if java is None:
            raise StackError(
                f"Java 17 is needed for Apache Kafka ({self.settings.java} not found): install "
                "it with `apt-get install -y openjdk-17-jre-headless` or set OUTBOX_STACK_JAVA"
            )
        return java

    def _java_command(self, main: str, *arguments: str, heap: str | None = None) -> list[str]:
        memory = [f"-Xms{heap}", f"-Xmx{heap}"] if heap else ["-Xmx256m"]
        return [
            self._java(),
            *memory,
            "-XX:+UseG1GC",
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={self.home / 'log4j2.properties'}",
            "-cp",
            java_classpath(self.settings.downloads_root, "broker"),
            main,
            *arguments,
        ]

    def _format_storage(self, properties: Path) -> None:
        """Format the data folder once (KRaft needs a cluster id and its metadata log)."""
        if (self.data_dir / "meta.properties").exists():
            return
        command = self._java_command(
            # "=": an id may begin with "-", which would read as an option on its own
            STORAGE_TOOL,
            "format",
            f"--cluster-id={new_cluster_id()}",
            "--config",
            str(properties),
        )
        result = subprocess.run(
            command, capture_output=True, text=True, check=False, timeout=120, cwd=self.home
        )
        if result.returncode != 0:
            raise StackError(
                f"formatting the broker's storage in {self.data_dir} failed:\n"
                + (result.stdout + result.stderr)[-2000:]
            )

    def up(self) -> BrokerStatus:
        """Start the broker if stopped (formatting its storage the first time); wait until a
        Kafka client gets the cluster's metadata."""
        if not self.process.is_running():
            self.bootstrap_servers = self.settings.bootstrap_servers
            properties = self._write_configuration()
            self._format_storage(properties)
            self.process.start(
                self._java_command(KAFKA_MAIN, str(properties), heap=self.settings.broker_heap)
            )
            self.address_file.write_text(self.bootstrap_servers + "\n")
        self.wait_until_ready()
        return self.status()

    def down(self) -> None:
        """Stop the broker (a controlled shutdown; the data stays)."""
        self.process.stop(timeout=60)
        self.address_file.unlink(missing_ok=True)

    def status(self) -> BrokerStatus:
        return BrokerStatus(
            self.process.is_running(), self.process.pid(), self.bootstrap_servers, self.data_dir
        )

    def _listening(self) -> bool:
        host, _, port = self.bootstrap_servers.rpartition(":")
        try:
            with socket.create_connection((host, int(port)), timeout=1):
                return True
        except OSError:
            return False

    def wait_until_ready(self) -> None:
        from kafka import KafkaAdminClient

        from outbox.core.errors import BrokerAuthenticationError, BrokerError
        from outbox.kafka_clients import kafka_errors, open_client
        from outbox.kafka_options import client_options

        admin_settings = self.admin_settings()
        deadline = time.monotonic() + self.settings.broker_start_timeout_seconds
        last_error: Exception | None = None
        while time.monotonic() < deadline:
            if not self.process.is_running():
                raise StackError(
                    f"the broker exited during start-up; see {self.process.log_file}:\n"
                    + "\n".join(self.process.tail(20))
                )
            if not self._listening():
                time.sleep(0.2)  # the JVM is still starting: a client now would only log errors
                continue
            try:
                admin = open_client(  # logs in first: a refused login is said at once
                    admin_settings,
                    KafkaAdminClient,
                    {
                        **client_options(admin_settings, client_id="outbox-stack"),
                        "request_timeout_ms": 3000,
                        "bootstrap_timeout_ms": 3000,
                    },
                )
                try:
                    # Registered: the metadata lists this broker (Connect's first request,
                    # the cluster id, waits for a node and gives up after a minute).
                    with kafka_errors(admin_settings):
                        if admin.describe_cluster().get("brokers"):
                            return
                finally:
                    admin.close()
                time.sleep(0.2)
            except BrokerAuthenticationError as error:
                raise StackError(f"the broker refused the stack's own client: {error}") from error
            except (BrokerError, OSError, ValueError) as error:
                last_error = error
                time.sleep(0.2)
        raise StackError(
            f"the broker did not answer on {self.bootstrap_servers} within "
            f"{self.settings.broker_start_timeout_seconds:.0f} s (last error: {last_error}); "
            f"see {self.process.log_file}"
        )
