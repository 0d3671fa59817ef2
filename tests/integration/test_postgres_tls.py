"""PostgreSQL over TLS, with the certificate the local stack makes: the SDK, the relay, the CLI
and Debezium's connector each connect with ``sslmode=verify-full``; a client that does not
trust the certificate's CA, or that connects by a name the certificate does not hold, is
refused at once with an error that says which (never retried as an outage)."""

from __future__ import annotations

import os
import pwd
import re
import shlex
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.orm import Session

from outbox import DatabaseTlsError, Event, Outbox, OutboxSettings
from outbox.consumer import IdempotentConsumer
from outbox.core.contract import topic_for
from outbox.core.database_tls import TlsFailure
from outbox.core.errors import ConnectError
from outbox_connect import ConnectClient, render_connector_config
from outbox_stack import PostgresCluster
from outbox_stack.local import LocalStack
from outbox_stack.tls import TlsFiles, ensure_certificates
from tests.cli import run_outbox
from tests.fix_cdc import CdcPath
from tests.fix_postgres import ScratchDatabase
from tests.fix_proxy import TcpProxy
from tests.fix_relay import RelayBench, wait_until
from tests.fix_stack import KafkaServices
from tests.kafka_read import read_until
from tests.kafka_wire import contract_record, own_topic, send

pytestmark = pytest.mark.timeout(300)

REFUSED_WITHIN_SECONDS = 15  # generous: the machine is shared; a refusal takes milliseconds
TLS_FAILED = "TLS with PostgreSQL failed"
# What each refusal says, in our words (outbox.core.database_tls).
SAYS = {
    TlsFailure.UNTRUSTED_CERTIFICATE: "certificate is not trusted",
    TlsFailure.HOST_NOT_IN_CERTIFICATE: "certificate is not for the host connected to",
}
FAILURES = list(SAYS)


@pytest.fixture(scope="module")
def other_ca(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The CA file of another stack: valid, but not the one that signed our server."""
    folder = tmp_path_factory.mktemp("other-ca")
    files = TlsFiles(folder / "ca.crt", folder / "server.crt", folder / "server.key")
    ensure_certificates(files, label="another stack")
    return files.ca_cert


def refused_url(url: str, failure: TlsFailure, other_ca: Path) -> str:
    """``url`` (verify-full) made to fail one way: another CA file, or a host name the
    certificate does not hold (libpq checks ``host`` and connects to ``hostaddr``)."""
    parsed = sa.engine.make_url(url)
    if failure is TlsFailure.UNTRUSTED_CERTIFICATE:
        parsed = parsed.update_query_dict({"sslrootcert": str(other_ca)})
    else:
        parsed = parsed.set(host="db.invalid").update_query_dict({"hostaddr": "127.0.0.1"})
    return parsed.render_as_string(hide_password=False)


def tls_of(connection: psycopg.Connection[Any]) -> tuple[bool, str]:
    row = connection.execute(
        "SELECT ssl, version FROM pg_stat_ssl WHERE pid = pg_backend_pid()"
    ).fetchone()
    assert row is not None
    return bool(row[0]), str(row[1])


# -- the local stack ------------------------------------------------------------------------


def test_the_stack_serves_tls_only_with_a_certificate_it_made(own_cluster: PostgresCluster) -> None:
    """A CA of the stack's own signs a server certificate for localhost and 127.0.0.1; the key
    is 0600 and the server's user's; TCP takes TLS only; the stack's URL and connection string
    verify the certificate and its host name."""
    own_cluster.up()
    files = own_cluster.tls_files
    assert own_cluster.ca_file == own_cluster.home / "tls" / "ca.crt"
    key = files.server_key.stat()
    server_user = "postgres" if os.geteuid() == 0 else pwd.getpwuid(os.geteuid()).pw_name
    assert (key.st_mode & 0o777, pwd.getpwuid(key.st_uid).pw_name) == (0o600, server_user)
    names = subprocess.run(
        ["openssl", "x509", "-in", str(files.server_cert), "-noout", "-ext", "subjectAltName"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "DNS:localhost" in names and "IP Address:127.0.0.1" in names, names
    no_secret_but_the_key = [
        path
        for folder in {own_cluster.ca_file.parent, files.server_key.parent}
        for path in folder.iterdir()
        if "PRIVATE KEY" in path.read_text(errors="replace")
    ]
    assert no_secret_but_the_key == [files.server_key], "the CA's key is never written"

    rules = [
        line.split()
        for line in (own_cluster.data_dir / "pg_hba.conf").read_text().splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    assert {rule[0] for rule in rules} == {"local", "hostssl"}, rules
    assert f"sslmode=verify-full&sslrootcert={own_cluster.ca_file}" in own_cluster.url()
    for host in ("127.0.0.1", "localhost"):
        conninfo = psycopg.conninfo.make_conninfo(own_cluster.conninfo(), host=host)
        with psycopg.connect(conninfo) as connection:
            assert tls_of(connection)[0], host
    plain = psycopg.conninfo.make_conninfo(own_cluster.conninfo(), sslmode="disable")
    with pytest.raises(psycopg.OperationalError, match="no encryption"):
        psycopg.connect(plain, connect_timeout=5)


def test_up_restarts_a_running_cluster_that_serves_no_tls_yet(own_cluster: PostgresCluster) -> None:
    """A cluster a version before TLS started (`host` rules, no `ssl`), still running: the next
    `up` restarts it with TLS, and the stack's verifying URL connects."""
    own_cluster.up()
    own_cluster.down()
    hba = own_cluster.data_dir / "pg_hba.conf"
    hba.write_text(re.sub(r"(?m)^hostssl", "host", hba.read_text()))
    options = (
        f"-c port={own_cluster.port} -c listen_addresses=127.0.0.1 -c ssl=off "
        "-c unix_socket_directories=''"
    )
    own_cluster._pg_ctl("start", "-w", "-l", str(own_cluster.log_file), "-o", options)
    old_pid = own_cluster.pid()
    own_cluster.up()
    assert own_cluster.pid() != old_pid, "restarted"
    with psycopg.connect(own_cluster.conninfo()) as connection:
        assert tls_of(connection)[0]


def test_a_certificate_that_no_longer_verifies_is_replaced_at_the_next_up(
    own_cluster: PostgresCluster, other_ca: Path
) -> None:
    """The CA file replaced by another (or a certificate expiring within 30 days, a key that
    does not match): `up` makes a new CA and certificate and the server serves them."""
    own_cluster.up()
    own_cluster.ca_file.write_bytes(other_ca.read_bytes())
    with pytest.raises(psycopg.OperationalError, match="certificate verify failed"):
        psycopg.connect(own_cluster.conninfo(), connect_timeout=5)
    own_cluster.up()
    assert own_cluster.ca_file.read_bytes() != other_ca.read_bytes()
    with psycopg.connect(own_cluster.conninfo()) as connection:
        assert tls_of(connection)[0]


def test_stack_env_exports_what_clients_need_to_verify_the_server(
    own_cluster: PostgresCluster,
) -> None:
    """`eval "$(outbox stack env)"`: the database URL verifies the certificate with the stack's
    CA, the connector's settings say the same, and `outbox db upgrade` works from that shell."""
    own_cluster.up()
    environment = LocalStack(own_cluster.settings).environment()
    ca = str(own_cluster.ca_file)
    assert environment["OUTBOX_DATABASE_URL"].endswith(f"?sslmode=verify-full&sslrootcert={ca}")
    assert environment["OUTBOX_CONNECT_DATABASE_SSLMODE"] == "verify-full"
    assert environment["OUTBOX_CONNECT_DATABASE_SSLROOTCERT"] == ca
    cli = f"{shlex.quote(sys.executable)} -m outbox_cli.main"
    upgraded = subprocess.run(
        ["bash", "-c", f'eval "$({cli} stack env)" && {cli} db upgrade && {cli} db current'],
        env={
            **os.environ,
            "OUTBOX_STACK_DIR": str(own_cluster.settings.dir),
            "OUTBOX_STACK_POSTGRES_PORT": str(own_cluster.port),
        },
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert upgraded.returncode == 0, upgraded.stderr
    assert "at revision" in upgraded.stdout


# -- the SDK --------------------------------------------------------------------------------


async def test_the_sdk_publishes_over_verify_full(database: ScratchDatabase) -> None:
    """SQLAlchemy (`postgresql+psycopg://...?sslmode=verify-full&sslrootcert=...`, sync and
    async) and psycopg (a libpq connection string): every session is TLS, every event written."""
    assert "sslmode=verify-full" in database.url and "sslmode=verify-full" in database.conninfo
    aggregate = f"tls-{uuid.uuid4().hex[:8]}"
    engine = sa.create_engine(database.url)
    try:
        with Session(engine) as session, session.begin():
            Outbox().publish(session, Event(aggregate, "1", "Happened", {"by": "sqlalchemy"}))
            raw = session.connection().connection.driver_connection
            assert isinstance(raw, psycopg.Connection) and tls_of(raw)[0]
    finally:
        engine.dispose()
    with psycopg.connect(database.conninfo) as connection:
        assert tls_of(connection)[0]
        Outbox().publish(connection, Event(aggregate, "1", "Happened", {"by": "psycopg"}))
    async_engine = create_async_engine(database.url)
    try:
        async with async_engine.begin() as connection:
            from outbox import AsyncOutbox

            await AsyncOutbox().publish(connection, Event(aggregate, "1", "Happened", {}))
            ssl = await connection.exec_driver_sql(
                "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()"
            )
            assert ssl.scalar() is True
    finally:
        await async_engine.dispose()
    with psycopg.connect(database.conninfo) as connection:
        row = connection.execute(
            "SELECT count(*) FROM outbox.outbox WHERE aggregatetype = %s", (aggregate,)
        ).fetchone()
    assert row == (3,)


@pytest.mark.parametrize("failure", FAILURES, ids=[failure.name for failure in FAILURES])
def test_a_consumer_that_cannot_verify_the_server_stops_at_once(
    kafka_services: KafkaServices, database: ScratchDatabase, other_ca: Path, failure: TlsFailure
) -> None:
    """The idempotent consumer's database refuses TLS: no retry "until the database is back",
    no dead letter; `DatabaseTlsError` saying which, at the first record."""
    bootstrap = kafka_services.bootstrap_servers
    aggregate = f"tls-consumer-{uuid.uuid4().hex[:8]}"
    engine = sa.create_engine(refused_url(database.url, failure, other_ca))
    with own_topic(bootstrap, topic_for(aggregate)) as topic:
        send(bootstrap, [contract_record(aggregate, 0)])
        consumer: IdempotentConsumer[Any] = IdempotentConsumer(
            name="tls-test",
            group_id=f"tls-{uuid.uuid4().hex[:8]}",
            bootstrap_servers=bootstrap,
            begin=engine.begin,
            handler=lambda _connection, _event: None,
            topics=[topic],
            consumer_options={"session_timeout_ms": 6000, "heartbeat_interval_ms": 1000},
        )
        try:
            deadline = time.monotonic() + 90
            with pytest.raises(DatabaseTlsError) as refused:
                while time.monotonic() < deadline:
                    started = time.monotonic()
                    consumer.poll_once(timeout_seconds=0.5)
            assert time.monotonic() - started < REFUSED_WITHIN_SECONDS
        finally:
            consumer.close()
            engine.dispose()
    assert refused.value.failure == failure.value
    assert SAYS[failure] in str(refused.value)
    assert consumer.stats.dead_lettered == 0 and consumer.stats.handler_failures == 0


# -- the relay ------------------------------------------------------------------------------


def test_the_relay_runs_as_its_own_role_over_verify_full(relay_bench: RelayBench) -> None:
    """`outbox db relay-role`, then `outbox relay run` as that role with a verify-full URL:
    its session is TLS, every event reaches Kafka."""
    role = f"relay_{uuid.uuid4().hex[:8]}"
    database = relay_bench.database
    created = run_outbox(
        "db",
        "relay-role",
        role,
        env={"OUTBOX_DATABASE_URL": database.url, "OUTBOX_RELAY_DATABASE_PASSWORD": "tls-42"},
    )
    assert created.returncode == 0, created.stderr
    url = sa.engine.make_url(database.url).set(username=role, password="tls-42")
    assert url.query["sslmode"] == "verify-full"
    aggregate = f"tls-relay-{uuid.uuid4().hex[:8]}"
    engine = sa.create_engine(database.url)
    try:
        with Session(engine) as session, session.begin():
            Outbox().publish_many(
                session, [Event(aggregate, "1", "Happened", {"n": n}) for n in range(20)]
            )
    finally:
        engine.dispose()
    relay = relay_bench.process(OUTBOX_DATABASE_URL=url.render_as_string(hide_password=False))
    wait_until(lambda: relay_bench.undelivered() == 0, timeout=60, what="relayed over TLS")
    with database.connect() as connection:
        sessions = connection.execute(
            "SELECT s.ssl FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid) "
            "WHERE a.usename = %s AND a.application_name = 'outbox-relay'",
            (role,),
        ).fetchall()
    assert sessions and all(ssl for (ssl,) in sessions), sessions
    records = read_until(
        relay_bench.kafka.bootstrap_servers, topic_for(aggregate), lambda r: len(r) >= 20
    )
    assert len(records) >= 20
    assert relay.terminate() == 0


@pytest.mark.parametrize("failure", FAILURES, ids=[failure.name for failure in FAILURES])
def test_a_relay_that_cannot_verify_the_server_stops_with_the_reason(
    relay_bench: RelayBench, other_ca: Path, failure: TlsFailure
) -> None:
    """Not a database outage to retry for ever: `outbox relay run` exits 2 at once, and its
    last line (and its JSON log) says which TLS check failed."""
    url = refused_url(relay_bench.database.url, failure, other_ca)
    started = time.monotonic()
    relay = relay_bench.process(OUTBOX_DATABASE_URL=url)
    assert relay.process is not None
    code = relay.process.wait(timeout=60)
    assert time.monotonic() - started < REFUSED_WITHIN_SECONDS + 10  # + the interpreter's start
    output = relay.log.read_text()
    assert code == 2, output
    last = output.strip().splitlines()[-1]
    assert last.startswith(f"error: {TLS_FAILED}") and SAYS[failure] in last, output
    assert '"relay stopped: ' in output, "the JSON log says it too"
    assert "retrying" not in output


# -- the CLI --------------------------------------------------------------------------------

CLI_COMMANDS = [
    ("db", "current"),
    ("effects", "list"),
    ("relay", "dead-letters", "list"),
    ("consumer", "dead-letters", "list"),
]


@pytest.mark.parametrize("command", CLI_COMMANDS, ids=[" ".join(c) for c in CLI_COMMANDS])
def test_cli_commands_connect_over_verify_full(
    database: ScratchDatabase, command: tuple[str, ...]
) -> None:
    result = run_outbox(*command, env={"OUTBOX_DATABASE_URL": database.url}, timeout=60)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("failure", FAILURES, ids=[failure.name for failure in FAILURES])
@pytest.mark.parametrize("command", CLI_COMMANDS, ids=[" ".join(c) for c in CLI_COMMANDS])
def test_cli_commands_refuse_a_server_they_cannot_verify_with_the_reason(
    database: ScratchDatabase, other_ca: Path, command: tuple[str, ...], failure: TlsFailure
) -> None:
    url = refused_url(database.url, failure, other_ca)
    started = time.monotonic()
    result = run_outbox(*command, env={"OUTBOX_DATABASE_URL": url}, timeout=60)
    assert time.monotonic() - started < REFUSED_WITHIN_SECONDS + 10  # + the interpreter's start
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {TLS_FAILED}"), result.stderr
    assert SAYS[failure] in lines[0]


# -- Debezium's connector -------------------------------------------------------------------


def test_the_connector_streams_over_verify_full(cdc: CdcPath) -> None:
    """The suite's connector verifies the server's certificate (database.sslmode=verify-full,
    database.sslrootcert=the stack's CA): its sessions are TLS, and a row inserted arrives."""
    config = cdc.client.request("GET", f"/connectors/{cdc.connector.name}/config")
    assert config["database.sslmode"] == "verify-full"
    assert config["database.sslrootcert"] == str(cdc.database.cluster.ca_file)
    aggregate = f"tls-cdc-{uuid.uuid4().hex[:8]}"
    engine = sa.create_engine(cdc.database.url)
    try:
        with Session(engine) as session, session.begin():
            result = Outbox().publish(session, Event(aggregate, "7", "Happened", {"tls": True}))
    finally:
        engine.dispose()
    records: list[Any] = cdc.consume(topic_for(aggregate), 1)
    assert dict(records[0].headers)["id"] == str(result.event_id).encode()
    with cdc.database.connect() as connection:
        sessions = connection.execute(
            "SELECT s.ssl FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid) "
            "WHERE a.usename = %s",
            (cdc.connector.database_user,),
        ).fetchall()
    assert sessions and all(ssl for (ssl,) in sessions), sessions


@pytest.fixture
def connector_name(cdc: CdcPath) -> Iterator[str]:
    name = f"outbox-tls-{uuid.uuid4().hex[:8]}"
    yield name
    cdc.client.delete(name)


@pytest.mark.parametrize("failure", FAILURES, ids=[failure.name for failure in FAILURES])
def test_a_connector_that_cannot_verify_the_server_is_refused_with_the_reason(
    cdc: CdcPath,
    other_ca: Path,
    connector_name: str,
    tcp_proxy: Callable[..., TcpProxy],
    failure: TlsFailure,
) -> None:
    """Debezium checks the connection when the connector is applied: another CA file, or the
    server reached at 127.0.0.2 (a proxy; the certificate names 127.0.0.1 and localhost),
    and Connect refuses the configuration at once; our client says which TLS check failed."""
    if failure is TlsFailure.UNTRUSTED_CERTIFICATE:
        changes: dict[str, Any] = {"database_sslrootcert": str(other_ca)}
    else:
        proxy = tcp_proxy("127.0.0.1", cdc.database.cluster.port, listen_host="127.0.0.2")
        changes = {"database_host": "127.0.0.2", "database_port": proxy.port}
    connector = cdc.connector.model_copy(
        update={"name": connector_name, "slot_name": f"slot_{uuid.uuid4().hex[:8]}", **changes}
    )
    config = render_connector_config(connector, OutboxSettings())
    started = time.monotonic()
    with pytest.raises(ConnectError) as refused:
        ConnectClient(connector.url).apply(connector_name, config)
    assert time.monotonic() - started < REFUSED_WITHIN_SECONDS
    assert TLS_FAILED in str(refused.value) and SAYS[failure] in str(refused.value)
