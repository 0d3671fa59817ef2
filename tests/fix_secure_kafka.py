"""A secured Apache Kafka of the suite's own: TLS everywhere, SASL and mutual TLS, ACLs on.

- Listeners (all on 127.0.0.1): ``CLIENT`` is ``SASL_SSL`` (SCRAM-SHA-256, SCRAM-SHA-512 and
  PLAIN), ``MTLS`` is ``SSL`` with a client certificate required (also the broker's own
  inter-broker listener), and the KRaft controller's is mutual TLS too. Certificates come from
  an authority the suite makes (:mod:`tests.tls`); a second authority signs certificates the
  broker must not trust.
- A principal is ``User:<name>`` whether it logs in with SASL or a certificate ``CN=<name>``.
  ``broker`` and ``admin`` are super users; nobody else may do anything an ACL does not allow
  (``allow.everyone.if.no.acl.found=false``). The ACLs are the least each component needs
  (:data:`ACLS`, as docs/production.md lists them).
- SCRAM users are created by the admin (over mutual TLS) through the admin API once the broker
  is up, so no password is on a command line; PLAIN users are in the broker's JAAS
  configuration (its server.properties is readable by its owner only).

``secure_kafka`` (session): the broker. ``secure_connect`` (session): a Kafka Connect worker
with Debezium whose clients log in as ``connect`` (SCRAM-SHA-512) on the SASL_SSL listener.
"""

from __future__ import annotations

import secrets
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from outbox.core.contract import TOPIC_PREFIX
from outbox.kafka_options import client_options
from outbox.settings import KafkaSettings, SaslMechanism
from outbox_stack import PostgresCluster
from outbox_stack.broker import BrokerSecurity, KafkaBroker
from outbox_stack.connect import CONNECT_GROUP, ConnectWorker
from tests.fix_postgres import free_port
from tests.fix_stack import stack_settings
from tests.tls import Authority, Issued

USERS = ("admin", "relay", "reconcile", "lake", "consumer", "connect", "stranger")
CONSUMER_GROUP = "outbox-secure-consumer"
CDC_TOPIC_PREFIX = "securecdc"
HEARTBEAT_TOPIC = f"{CDC_TOPIC_PREFIX}.outbox.outbox_heartbeat"

# (principal, resource type, name, pattern type, operations): the least each one needs.
ACLS: list[tuple[str, str, str, str, tuple[str, ...]]] = [
    # The relay writes the outbox topics (creating one on first use); in auto and cleanup
    # mode its CDC watch reads them back, with the connector's heartbeat topic. No group.
    ("relay", "TOPIC", TOPIC_PREFIX, "PREFIXED", ("WRITE", "DESCRIBE", "CREATE", "READ")),
    ("relay", "TOPIC", HEARTBEAT_TOPIC, "LITERAL", ("READ", "DESCRIBE")),
    # Reconcile, trace and the lake read the outbox topics (no group: they assign).
    ("reconcile", "TOPIC", TOPIC_PREFIX, "PREFIXED", ("READ", "DESCRIBE")),
    ("lake", "TOPIC", TOPIC_PREFIX, "PREFIXED", ("READ", "DESCRIBE")),
    ("lake", "GROUP", "outbox-lake", "PREFIXED", ("READ",)),
    # IdempotentConsumer reads the outbox topics in its consumer group.
    ("consumer", "TOPIC", TOPIC_PREFIX, "PREFIXED", ("READ", "DESCRIBE")),
    ("consumer", "GROUP", CONSUMER_GROUP, "LITERAL", ("READ", "DESCRIBE")),
    # Kafka Connect: its three topics, its group, the transactional ids of exactly-once
    # source (the leader's connect-cluster-<group>, each task's <group>-<connector>-<task>),
    # and what Debezium writes: the outbox topics and the heartbeat topics.
    (
        "connect",
        "TOPIC",
        f"{CONNECT_GROUP}-",
        "PREFIXED",
        ("READ", "WRITE", "DESCRIBE", "CREATE", "DESCRIBE_CONFIGS"),
    ),
    ("connect", "GROUP", CONNECT_GROUP, "LITERAL", ("READ", "DESCRIBE")),
    ("connect", "TRANSACTIONAL_ID", CONNECT_GROUP, "PREFIXED", ("WRITE", "DESCRIBE")),
    (
        "connect",
        "TRANSACTIONAL_ID",
        f"connect-cluster-{CONNECT_GROUP}",
        "LITERAL",
        ("WRITE", "DESCRIBE"),
    ),
    ("connect", "TOPIC", TOPIC_PREFIX, "PREFIXED", ("WRITE", "DESCRIBE", "CREATE")),
    ("connect", "TOPIC", f"{CDC_TOPIC_PREFIX}.", "PREFIXED", ("WRITE", "DESCRIBE", "CREATE")),
    ("connect", "TOPIC", "__debezium-heartbeat.", "PREFIXED", ("WRITE", "DESCRIBE", "CREATE")),
]


@dataclass
class SecureKafka:
    broker: KafkaBroker
    authority: Authority
    rogue: Authority
    """An authority the broker does not trust."""
    certificates: dict[str, Issued]
    passwords: dict[str, str]
    mtls_port: int

    @property
    def sasl_servers(self) -> str:
        return self.broker.bootstrap_servers

    @property
    def mtls_servers(self) -> str:
        return f"127.0.0.1:{self.mtls_port}"

    def sasl(
        self,
        user: str,
        *,
        mechanism: SaslMechanism = "SCRAM-SHA-512",
        password: str | None = None,
        cafile: Path | None = None,
    ) -> KafkaSettings:
        """``user``'s settings on the SASL_SSL listener."""
        return KafkaSettings(
            bootstrap_servers=self.sasl_servers,
            security_protocol="SASL_SSL",
            sasl_mechanism=mechanism,
            sasl_username=user,
            sasl_password=password if password is not None else self.passwords[user],
            ssl_cafile=cafile or self.authority.certfile,
        )

    def mtls(self, user: str, *, certificate: Issued | None = None) -> KafkaSettings:
        """``user``'s settings on the mutual TLS listener (its own certificate by default)."""
        issued = certificate or self.certificates[user]
        return KafkaSettings(
            bootstrap_servers=self.mtls_servers,
            security_protocol="SSL",
            ssl_cafile=self.authority.certfile,
            ssl_certfile=issued.certfile,
            ssl_keyfile=issued.keyfile,
        )

    @contextmanager
    def admin(self) -> Iterator[Any]:
        """A kafka-python admin client logged in as the super user ``admin`` (mutual TLS)."""
        from kafka import KafkaAdminClient

        client = KafkaAdminClient(**client_options(self.mtls("admin"), client_id="tests-admin"))
        try:
            yield client
        finally:
            client.close()


def _broker_security(
    authority: Authority, broker: Issued, mtls_port: int, plain: dict[str, str]
) -> BrokerSecurity:
    scram = "org.apache.kafka.common.security.scram.ScramLoginModule required;"
    plain_users = " ".join(f'user_{user}="{password}"' for user, password in plain.items())
    admin = KafkaSettings(
        bootstrap_servers=f"127.0.0.1:{mtls_port}",
        security_protocol="SSL",
        ssl_cafile=authority.certfile,
        ssl_certfile=authority.folder / "admin.crt.pem",
        ssl_keyfile=authority.folder / "admin.key.pem",
    )
    return BrokerSecurity(
        client_protocol="SASL_SSL",
        admin=admin,
        listeners={"MTLS": ("SSL", mtls_port)},
        inter_broker_listener="MTLS",
        controller_protocol="SSL",
        properties={
            "ssl.keystore.type": "PEM",
            "ssl.keystore.certificate.chain": broker.certfile.read_text(),
            "ssl.keystore.key": broker.keyfile.read_text(),
            "ssl.truststore.type": "PEM",
            "ssl.truststore.certificates": authority.pem,
            "listener.name.mtls.ssl.client.auth": "required",
            "listener.name.controller.ssl.client.auth": "required",
            "listener.name.client.sasl.enabled.mechanisms": "SCRAM-SHA-256,SCRAM-SHA-512,PLAIN",
            "listener.name.client.scram-sha-256.sasl.jaas.config": scram,
            "listener.name.client.scram-sha-512.sasl.jaas.config": scram,
            "listener.name.client.plain.sasl.jaas.config": (
                f"org.apache.kafka.common.security.plain.PlainLoginModule required {plain_users};"
            ),
            "ssl.principal.mapping.rules": "RULE:^CN=([^,]+)$/$1/,DEFAULT",
            "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            "super.users": "User:broker;User:admin",
            "allow.everyone.if.no.acl.found": "false",
            # A refused login is answered at once (Kafka's default delays it by 100 ms).
            "connection.failed.authentication.delay.ms": "0",
        },
    )


def grant_acls(admin: Any) -> None:
    from kafka.admin import (
        ACL,
        ACLOperation,
        ACLPermissionType,
        ACLResourcePatternType,
        ResourcePattern,
        ResourceType,
    )

    acls = [
        ACL(
            principal=f"User:{principal}",
            host="*",
            operation=ACLOperation[operation],
            permission_type=ACLPermissionType.ALLOW,
            resource_pattern=ResourcePattern(
                ResourceType[resource], name, ACLResourcePatternType[pattern]
            ),
        )
        for principal, resource, name, pattern, operations in ACLS
        for operation in operations
    ]
    result = admin.create_acls(acls)
    assert not result["failed"], result["failed"]


def create_scram_users(admin: Any, passwords: dict[str, str]) -> None:
    from kafka.admin import UserScramCredentialUpsertion

    for mechanism in ("SCRAM-SHA-256", "SCRAM-SHA-512"):  # one credential a user a request
        upserts = [UserScramCredentialUpsertion(u, mechanism, p) for u, p in passwords.items()]
        failed = {u: e for u, e in admin.alter_user_scram_credentials(upserts).items() if e}
        assert not failed, failed


@pytest.fixture(scope="session")
def secure_kafka(cluster: PostgresCluster) -> Iterator[SecureKafka]:
    root = cluster.settings.dir.parent / "secure"
    shutil.rmtree(root, ignore_errors=True)
    authority = Authority(root / "tls", "outbox-test-ca")
    rogue = Authority(root / "rogue", "rogue-ca")
    certificates = {user: authority.issue(user) for user in USERS}
    broker_certificate = authority.issue("broker", hosts=("127.0.0.1", "localhost"))
    passwords = {user: secrets.token_urlsafe(16) for user in USERS}
    mtls_port = free_port()
    # A machine shared with other suites can take minutes to start a JVM: wait long enough.
    settings = stack_settings(root, cluster.port).model_copy(
        update={"broker_start_timeout_seconds": 300.0}
    )
    broker = KafkaBroker(
        settings,
        security=_broker_security(authority, broker_certificate, mtls_port, passwords),
    )
    broker.down()  # left running by an interrupted run
    secure = SecureKafka(broker, authority, rogue, certificates, passwords, mtls_port)
    try:
        broker.up()
        with secure.admin() as admin:
            create_scram_users(admin, passwords)
            grant_acls(admin)
        yield secure
    finally:
        broker.down()


@dataclass(frozen=True)
class SecureConnect:
    kafka: SecureKafka
    worker: ConnectWorker


@pytest.fixture(scope="session")
def secure_connect(secure_kafka: SecureKafka, cluster: PostgresCluster) -> Iterator[SecureConnect]:
    """A Connect worker on the secured broker, as ``connect`` (SCRAM-SHA-512, SASL_SSL)."""
    settings = stack_settings(
        secure_kafka.broker.settings.root / "connect-stack", cluster.port
    ).model_copy(update={"connect_start_timeout_seconds": 400.0})
    worker = ConnectWorker(
        settings,
        bootstrap_servers=secure_kafka.sasl_servers,
        kafka=secure_kafka.sasl("connect"),
    )
    worker.down()
    try:
        worker.up(secrets={"OUTBOX_CONNECT_DATABASE_PASSWORD": cluster.cdc_password()})
        yield SecureConnect(secure_kafka, worker)
    finally:
        worker.down()
