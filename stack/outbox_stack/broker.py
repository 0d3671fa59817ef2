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
import shutil
import socket
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from outbox_stack.artifacts import java_classpath, java_versions
from outbox_stack.errors import StackError
from outbox_stack.process import ServiceProcess
from outbox_stack.settings import StackSettings

__all__ = ["BrokerStatus", "KafkaBroker", "same_servers"]

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
"""


def _servers(bootstrap_servers: str) -> frozenset[str]:
    found = set()
    for server in bootstrap_servers.split(","):
        host, _, port = server.strip().rpartition(":")
        host = host.strip("[]").lower()
        found.add(f"{'127.0.0.1' if host == 'localhost' else host}:{port}")
    return frozenset(found)


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


class KafkaBroker:
    def __init__(self, settings: StackSettings | None = None) -> None:
        self.settings = settings if settings is not None else StackSettings()
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

    def server_properties(self) -> dict[str, str]:
        host_port = self.bootstrap_servers
        controller = f"127.0.0.1:{self.settings.broker_controller_port}"
        return {
            "process.roles": "broker,controller",
            "node.id": str(NODE_ID),
            "controller.quorum.voters": f"{NODE_ID}@{controller}",
            "listeners": f"PLAINTEXT://{host_port},CONTROLLER://{controller}",
            "advertised.listeners": f"PLAINTEXT://{host_port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
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

    def _write_configuration(self) -> Path:
        self.home.mkdir(parents=True, exist_ok=True)
        properties = self.home / "server.properties"
        properties.write_text(
            "".join(f"{key}={value}\n" for key, value in self.server_properties().items())
        )
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
            STORAGE_TOOL, "format", "--cluster-id", new_cluster_id(), "--config", str(properties)
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
        from kafka.errors import KafkaError

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
                admin = KafkaAdminClient(
                    bootstrap_servers=self.bootstrap_servers,
                    request_timeout_ms=3000,
                )
                try:
                    # Registered: the metadata lists this broker (Connect's first request,
                    # the cluster id, waits for a node and gives up after a minute).
                    if admin.describe_cluster().get("brokers"):
                        return
                finally:
                    admin.close()
                time.sleep(0.2)
            except (KafkaError, OSError, ValueError) as error:
                last_error = error
                time.sleep(0.2)
        raise StackError(
            f"the broker did not answer on {self.bootstrap_servers} within "
            f"{self.settings.broker_start_timeout_seconds:.0f} s (last error: {last_error}); "
            f"see {self.process.log_file}"
        )
