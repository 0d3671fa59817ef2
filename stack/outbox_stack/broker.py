"""A Kafka-protocol broker on loopback for development and tests: Tansu.

Tansu speaks the Kafka wire protocol. Its storage engine is a setting
(``OUTBOX_STACK_BROKER_STORAGE``):

- ``s3`` (default): topics, committed offsets and Connect's topics are objects in the local
  object store (:mod:`outbox_stack.object_store`), on disk under the stack folder. A ``kill -9`` of
  the broker, of the store or of both loses nothing acknowledged; while the store is down the
  broker refuses clients and serves again, without a restart, once it is back.
- ``memory``: about twice as fast, and a broker restart loses every topic (a pause with
  SIGSTOP/SIGCONT loses nothing). For test runs where speed matters more than crashes.

Single node, no replication: a development broker, not a production one. Production and the
compose file use Apache Kafka; nothing in the project depends on Tansu's quirks (on ``s3``,
ListOffsets undercounts the end of a partition that got several batches within a second:
nothing may trust end offsets there; the conformance suite in tests/broker/ states this).

The broker records the address and the engine it was started with next to its pid file, so
the stack knows its own broker whatever a shell exports (``OUTBOX_KAFKA_BOOTSTRAP_SERVERS`` after
``eval "$(outbox stack env)"`` names it): see :meth:`TansuBroker.is_own`.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from outbox_stack.artifacts import tansu_binary
from outbox_stack.errors import StackError
from outbox_stack.object_store import BUCKET, SeaweedStore
from outbox_stack.process import ServiceProcess
from outbox_stack.settings import StackSettings

__all__ = ["BrokerStatus", "TansuBroker", "same_servers"]


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


@dataclass(frozen=True)
class BrokerStatus:
    running: bool
    pid: int | None
    bootstrap_servers: str
    storage: str


class TansuBroker:
    def __init__(self, settings: StackSettings | None = None) -> None:
        self.settings = settings if settings is not None else StackSettings()
        self.process = ServiceProcess("tansu", self.settings.root / "broker", marker="tansu")
        self.address_file = self.process.home / "tansu.address"
        self.storage_file = self.process.home / "tansu.storage"
        # A running broker is where, and on what, it was started, whatever the settings say now.
        self.bootstrap_servers = self._running_address() or self.settings.bootstrap_servers
        self.storage = self._running_storage() or self.settings.broker_storage
        self.object_store = SeaweedStore(self.settings) if self.storage == "s3" else None

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

    def _running_storage(self) -> str | None:
        if not self.process.is_running():
            return None
        try:
            return self.storage_file.read_text().strip() or None
        except FileNotFoundError:
            return None

    def describe(self) -> str:
        if self.object_store is None:
            return "Tansu, in memory"
        return f"Tansu, durable: s3 in {self.object_store.endpoint}"

    def up(self) -> BrokerStatus:
        """Start the object store (``s3``) and the broker if stopped; wait until a Kafka client
        gets the cluster's metadata (on ``s3``, read from the store)."""
        env: dict[str, str] | None = None
        storage_url = "memory://tansu/"
        if self.object_store is not None:
            self.object_store.up()
            env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
            env |= self.object_store.client_environment()
            storage_url = f"s3://{BUCKET}/"
        if not self.process.is_running():
            binary = tansu_binary(self.settings.downloads_root)
            url = f"tcp://{self.bootstrap_servers}"
            self.process.start(
                [
                    str(binary),
                    "broker",
                    "--listener-url",
                    url,
                    "--advertised-listener-url",
                    url,
                    "--storage-engine",
                    storage_url,
                ],
                env=env,
            )
            self.address_file.write_text(self.bootstrap_servers + "\n")
            self.storage_file.write_text(self.storage + "\n")
        self.wait_until_ready()
        return self.status()

    def down(self) -> None:
        """Stop the broker, then its object store (which keeps the data)."""
        self.process.stop()
        self.address_file.unlink(missing_ok=True)
        self.storage_file.unlink(missing_ok=True)
        # Also a store left by an earlier ``s3`` run of a broker now in memory: a no-op if none.
        (self.object_store or SeaweedStore(self.settings)).down()

    def status(self) -> BrokerStatus:
        return BrokerStatus(
            self.process.is_running(), self.process.pid(), self.bootstrap_servers, self.storage
        )

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
            try:
                admin = KafkaAdminClient(
                    bootstrap_servers=self.bootstrap_servers,
                    request_timeout_ms=3000,
                )
                try:
                    admin.list_topics()
                finally:
                    admin.close()
                return
            except (KafkaError, OSError, ValueError) as error:
                last_error = error
                time.sleep(0.2)
        raise StackError(
            f"the broker did not answer on {self.bootstrap_servers} within "
            f"{self.settings.broker_start_timeout_seconds:.0f} s (last error: {last_error}); "
            f"see {self.process.log_file}"
        )
