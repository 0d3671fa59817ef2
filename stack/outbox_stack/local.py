"""The whole native stack: PostgreSQL, Apache Kafka (one KRaft node), Kafka Connect with
Debezium; with ``OUTBOX_STACK_OBJECT_STORE=true``, SeaweedFS too (an S3-compatible store for
a lake on ``s3://lake/outbox``, :mod:`outbox_stack.object_store`).

Started in that order and stopped in the reverse order. With
``OUTBOX_KAFKA_BOOTSTRAP_SERVERS`` set to another cluster, no local broker is started and
Connect uses that cluster instead. Set to the stack's own broker (as ``outbox stack env``
exports it), it changes nothing: ``up`` and ``down`` still manage that broker.
"""

from __future__ import annotations

import os
import shlex
import shutil
from collections.abc import Mapping
from dataclasses import dataclass

from outbox.settings import KafkaSettings
from outbox_stack.broker import KafkaBroker
from outbox_stack.connect import ConnectWorker
from outbox_stack.jaeger import JAEGER_VERSION, JaegerPorts, JaegerService, jaeger_binary
from outbox_stack.object_store import SeaweedStore
from outbox_stack.postgres import PostgresCluster
from outbox_stack.process import ServiceProcess
from outbox_stack.settings import StackSettings

__all__ = ["LAKE_JOB_MARKER", "LocalStack", "ServiceLine", "shell_exports"]

LAKE_JOB_MARKER = "--lake-job"
"""The word of the lake job's command line (``python -m outbox_stack.demo --lake-job``)."""
RELAY_MARKER = "outbox_cli.main"
"""A word of the stack's relay's command line (``python -m outbox_cli.main relay run``)."""


def shell_exports(variables: Mapping[str, str]) -> str:
    """``export NAME=value`` lines for ``eval``; every value quoted by ``shlex.quote``, so no
    character in a value (a quote, ``$``, a backtick, a newline) can run shell."""
    return "".join(f"export {name}={shlex.quote(value)}\n" for name, value in variables.items())


@dataclass(frozen=True)
class ServiceLine:
    """One line of `outbox stack status`: a service, whether it runs, where, its log."""

    name: str
    running: bool
    address: str
    pid: int | None
    log: str
    data: str | None = None


class LocalStack:
    def __init__(
        self, settings: StackSettings | None = None, kafka: KafkaSettings | None = None
    ) -> None:
        self.settings = settings if settings is not None else StackSettings()
        kafka = kafka if kafka is not None else KafkaSettings()
        self.postgres = PostgresCluster(self.settings)
        self.own_broker = KafkaBroker(self.settings)
        exported = kafka.bootstrap_servers
        # Only a cluster that is not the stack's own broker is external.
        self.external_kafka = (
            exported if exported and not self.own_broker.is_own(exported) else None
        )
        self.broker = None if self.external_kafka else self.own_broker
        self.bootstrap_servers = self.external_kafka or self.own_broker.bootstrap_servers
        # An external cluster is reached with the security settings (OUTBOX_KAFKA_*); the
        # stack's own broker is PLAINTEXT on loopback.
        self.kafka = (
            kafka
            if self.external_kafka
            else KafkaSettings(bootstrap_servers=self.bootstrap_servers)
        )
        self.connect = ConnectWorker(
            self.settings, bootstrap_servers=self.bootstrap_servers, kafka=self.kafka
        )
        self.relay = ServiceProcess("relay", self.settings.root / "relay", RELAY_MARKER)
        """The relay `outbox demo` leaves running (auto mode: it deletes the rows CDC
        delivered, and publishes itself when CDC stops): a stack service from then on."""
        self.lake_job = ServiceProcess("lake-ingest", self.settings.root / "demo", LAKE_JOB_MARKER)
        """The lake's ingest job `outbox demo` starts and leaves running (a stack service
        from then on: `status` shows it, `down` stops it)."""
        self.own_object_store = SeaweedStore(self.settings)
        self.object_store = self.own_object_store if self.settings.object_store else None
        self.tracing = JaegerService(
            self.settings.downloads_root / "go" / "bin" / f"jaeger-{JAEGER_VERSION}",
            self.settings.root / "jaeger",
            JaegerPorts.from_ui_port(self.settings.tracing_port),
        )
        """Jaeger, started by `up` when OUTBOX_STACK_TRACING is set (stopped by `down` in
        any case)."""

    def up(self) -> list[ServiceLine]:
        self.postgres.up()
        if self.object_store is not None:
            self.object_store.up()
        if self.broker is not None:
            self.broker.up()
        self.connect.up(secrets={"OUTBOX_CONNECT_DATABASE_PASSWORD": self.cdc_password()})
        if self.settings.tracing:
            jaeger_binary(self.settings.downloads_root)  # built the first time
            self.tracing.up()
        return self.status()

    def environment(self) -> dict[str, str]:
        """What ``outbox stack env`` exports: the SDK's and the CLI's settings for this stack
        (never the Kafka security settings: an external cluster's are the shell's already).

        The database URL and the connector verify PostgreSQL's certificate against the stack's
        CA (``sslmode=verify-full``, the CA file as ``sslrootcert``)."""
        tls = self.postgres.tls_parameters()
        lake = {}
        local_lake = {"OUTBOX_LAKE_ROOT": str(self.settings.lake_root)}  # beside the stack
        if self.object_store is not None:  # the lake on the stack's S3 store, its keys with it
            local_lake = {}
            lake = {
                "OUTBOX_LAKE_ROOT": self.object_store.lake_root,
                **self.object_store.client_environment(),
            }
        return {
            **lake,
            "OUTBOX_DATABASE_URL": self.postgres.url(),
            "OUTBOX_KAFKA_BOOTSTRAP_SERVERS": self.bootstrap_servers,
            "OUTBOX_CONNECT_DATABASE_PASSWORD": self.cdc_password(),
            "OUTBOX_CONNECT_DATABASE_PORT": str(self.postgres.port),
            "OUTBOX_CONNECT_DATABASE_SSLMODE": tls["sslmode"],
            "OUTBOX_CONNECT_DATABASE_SSLROOTCERT": tls["sslrootcert"],
            "OUTBOX_CONNECT_URL": self.connect.rest_url,
            "OUTBOX_RELAY_DATABASE_PASSWORD": self.relay_password(),
            **local_lake,
            **(self._tracing_environment() if self.settings.tracing else {}),
        }

    def _tracing_environment(self) -> dict[str, str]:
        """OpenTelemetry's own variables, for an SDK (or `opentelemetry-instrument`) to send
        spans to the stack's Jaeger over OTLP/HTTP. Under `opentelemetry-instrument`, the
        kafka-python instrumentation stays off: it would add a second ``traceparent`` header
        to our records, and copies of one event would then differ (docs/operations.md)."""
        return {
            "OTEL_EXPORTER_OTLP_ENDPOINT": self.tracing.otlp_endpoint,
            "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
            "OTEL_TRACES_EXPORTER": "otlp",
            "OTEL_PYTHON_DISABLED_INSTRUMENTATIONS": "kafka",
        }

    def cdc_password(self) -> str:
        """OUTBOX_CONNECT_DATABASE_PASSWORD when set, else the stack's generated one."""
        return os.environ.get("OUTBOX_CONNECT_DATABASE_PASSWORD") or self.postgres.cdc_password()

    def relay_password(self) -> str:
        """OUTBOX_RELAY_DATABASE_PASSWORD when set, else the stack's generated one: what
        ``outbox db relay-role`` gives the relay's role, so the relay runs as that role."""
        return os.environ.get("OUTBOX_RELAY_DATABASE_PASSWORD") or self.postgres.relay_password()

    def down(self) -> None:
        self.lake_job.stop(timeout=60, group=True)  # finishes its batch; Spark's JVM with it
        self.relay.stop(timeout=30)  # drains what it sent, releases its lease
        self.connect.down()
        self.own_broker.down()  # started before an external cluster was set: still ours
        self.own_object_store.down()  # started before OUTBOX_STACK_OBJECT_STORE was unset
        self.tracing.down()  # started before OUTBOX_STACK_TRACING was unset: stopped too
        for process in self._retired_processes():
            process.stop()
        self.postgres.down()

    def _retired_processes(self) -> list[ServiceProcess]:
        """The broker and object store of releases before Apache Kafka (Tansu on SeaweedFS),
        left running in a stack folder from before an upgrade: ``down`` stops them too."""
        root = self.settings.root
        return [
            ServiceProcess("tansu", root / "broker", marker="tansu"),
            ServiceProcess("weed", root / "object-store", marker="weed"),
        ]

    def destroy(self) -> None:
        """Stop everything and delete the stack's data: the cluster (its server folder too,
        wherever it is), the broker's, the object store's and Connect's folders. Downloads
        are kept."""
        self.down()
        self.postgres.destroy()
        for process in (
            self.own_broker.process,
            self.connect.process,
            self.own_object_store.process,
            self.tracing.process,
            *self._retired_processes(),
        ):
            shutil.rmtree(process.home, ignore_errors=True)

    def status(self) -> list[ServiceLine]:
        postgres = self.postgres.status()
        lines = [
            ServiceLine(
                "postgres",
                postgres.running,
                self.postgres.display_url(),
                postgres.pid,
                str(postgres.log_file),
                str(postgres.data_dir),
            )
        ]
        if self.broker is not None:
            lines.append(
                ServiceLine(
                    "broker",
                    self.broker.process.is_running(),
                    f"kafka://{self.bootstrap_servers} ({self.broker.describe()})",
                    self.broker.process.pid(),
                    str(self.broker.process.log_file),
                    str(self.broker.data_dir),
                )
            )
        else:
            lines.append(
                ServiceLine(
                    "broker", True, f"kafka://{self.bootstrap_servers} (external)", None, "-"
                )
            )
        if self.object_store is not None:
            store = self.object_store.status()
            lines.append(
                ServiceLine(
                    "s3",
                    store.running,
                    f"{store.endpoint} (lake root {self.object_store.lake_root})",
                    store.pid,
                    str(self.object_store.process.log_file),
                    str(self.object_store.data_dir),
                )
            )
        if self.settings.tracing:
            lines.append(
                ServiceLine(
                    "jaeger",
                    self.tracing.process.is_running(),
                    f"{self.tracing.query_url} (UI), OTLP {self.tracing.otlp_endpoint}",
                    self.tracing.process.pid(),
                    str(self.tracing.process.log_file),
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
        if self.relay.pid_file.exists():  # started by `outbox demo`, not stopped since
            lines.append(
                ServiceLine(
                    "relay",
                    self.relay.is_running(),
                    f"auto mode, http://127.0.0.1:{self.settings.relay_port}/readyz",
                    self.relay.pid(),
                    str(self.relay.log_file),
                )
            )
        if self.lake_job.pid_file.exists():  # started by `outbox demo`, not stopped since
            lines.append(
                ServiceLine(
                    "lake",
                    self.lake_job.is_running(),
                    f"ingest job into {self._lake_root()}",
                    self.lake_job.pid(),
                    str(self.lake_job.log_file),
                )
            )
        return lines

    def _lake_root(self) -> str:
        try:
            return (self.lake_job.home / "lake-ingest.root").read_text().strip()
        except OSError:
            return str(self.settings.lake_root)

    def logs(self) -> dict[str, list[str]]:
        """The end of each service's log file, by service."""
        found = {"postgres": self.postgres.log_file}
        if self.broker is not None:
            found["broker"] = self.broker.process.log_file
        if self.object_store is not None:
            found["s3"] = self.object_store.process.log_file
        found["connect"] = self.connect.process.log_file
        return {
            name: path.read_text(errors="replace").splitlines() if path.exists() else []
            for name, path in found.items()
        }
