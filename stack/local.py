"""The whole native stack: PostgreSQL, a Kafka-protocol broker, Kafka Connect with Debezium.

Started in that order and stopped in the reverse order. With
``OUTBOX_KAFKA_BOOTSTRAP_SERVERS`` set, no local broker is started and Connect uses that
cluster instead.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from outbox.settings import KafkaSettings
from stack.broker import TansuBroker
from stack.connect import ConnectWorker
from stack.postgres import PostgresCluster
from stack.settings import StackSettings

__all__ = ["LocalStack", "ServiceLine"]


@dataclass(frozen=True)
class ServiceLine:
    """One line of `outbox stack status`: a service, whether it runs, where, its log."""

    name: str
    running: bool
    address: str
    pid: int | None
    log: str


class LocalStack:
    def __init__(
        self, settings: StackSettings | None = None, kafka: KafkaSettings | None = None
    ) -> None:
        self.settings = settings if settings is not None else StackSettings()
        kafka = kafka if kafka is not None else KafkaSettings()
        self.external_kafka = kafka.bootstrap_servers
        self.postgres = PostgresCluster(self.settings)
        self.broker = None if self.external_kafka else TansuBroker(self.settings)
        self.bootstrap_servers = self.external_kafka or self.settings.bootstrap_servers
        self.connect = ConnectWorker(self.settings, bootstrap_servers=self.bootstrap_servers)

    def up(self) -> list[ServiceLine]:
        self.postgres.up()
        if self.broker is not None:
            self.broker.up()
        self.connect.up(secrets={"OUTBOX_CONNECT_DATABASE_PASSWORD": self.cdc_password()})
        return self.status()

    def cdc_password(self) -> str:
        """OUTBOX_CONNECT_DATABASE_PASSWORD when set, else the stack's generated one."""
        return os.environ.get("OUTBOX_CONNECT_DATABASE_PASSWORD") or self.postgres.cdc_password()

    def down(self) -> None:
        self.connect.down()
        if self.broker is not None:
            self.broker.down()
        self.postgres.down()

    def status(self) -> list[ServiceLine]:
        postgres = self.postgres.status()
        lines = [
            ServiceLine(
                "postgres",
                postgres.running,
                self.postgres.display_url(),
                postgres.pid,
                str(postgres.log_file),
            )
        ]
        if self.broker is not None:
            lines.append(
                ServiceLine(
                    "broker",
                    self.broker.process.is_running(),
                    f"kafka://{self.bootstrap_servers} (Tansu, in memory)",
                    self.broker.process.pid(),
                    str(self.broker.process.log_file),
                )
            )
        else:
            lines.append(
                ServiceLine(
                    "broker", True, f"kafka://{self.bootstrap_servers} (external)", None, "-"
                )
            )
        lines.append(
            ServiceLine(
                "connect",
                self.connect.process.is_running(),
                self.connect.rest_url,
                self.connect.process.pid(),
                str(self.connect.process.log_file),
            )
        )
        return lines

    def logs(self) -> dict[str, list[str]]:
        """The end of each service's log file, by service."""
        found = {"postgres": self.postgres.log_file}
        if self.broker is not None:
            found["broker"] = self.broker.process.log_file
        found["connect"] = self.connect.process.log_file
        return {
            name: path.read_text(errors="replace").splitlines() if path.exists() else []
            for name, path in found.items()
        }
