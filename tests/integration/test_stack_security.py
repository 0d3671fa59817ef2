"""The local stack's security defaults: no `trust`, a private socket, secrets 0600 from the
first byte, and a Kafka Connect worker that gets only the environment it needs."""

from __future__ import annotations

import os
import pwd
import re
import stat
from pathlib import Path

import psycopg
import pytest

from outbox_stack import PostgresCluster
from outbox_stack.connect import CONNECTOR_SECRETS, INHERITED_VARIABLES
from tests.fix_stack import KafkaServices

pytestmark = pytest.mark.timeout(180)


def test_no_trust_the_socket_is_private_and_asks_for_the_password(
    own_cluster: PostgresCluster,
) -> None:
    """No `trust` line in pg_hba.conf; the socket folder is 0700 and the server's user's; over
    the socket a wrong password is refused and the right one accepted (SCRAM)."""
    own_cluster.up()
    rules = [
        line.split()
        for line in (own_cluster.data_dir / "pg_hba.conf").read_text().splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    assert rules and all(rule[-1] == "scram-sha-256" for rule in rules), rules
    info = own_cluster.socket_dir.stat()
    server_user = "postgres" if os.geteuid() == 0 else pwd.getpwuid(os.geteuid()).pw_name
    assert (info.st_mode & 0o777, pwd.getpwuid(info.st_uid).pw_name) == (0o700, server_user)
    assert (own_cluster.socket_dir / f".s.PGSQL.{own_cluster.port}").exists()
    over_socket = {
        "host": str(own_cluster.socket_dir),
        "port": own_cluster.port,
        "user": "postgres",
        "dbname": "postgres",
        "connect_timeout": 5,
    }
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        psycopg.connect(**over_socket, password="wrong")
    with psycopg.connect(**over_socket, password=own_cluster.password()) as connection:
        assert connection.execute("SELECT current_user").fetchone() == ("postgres",)


def test_a_cluster_made_with_trust_is_hardened_at_its_next_start(
    own_cluster: PostgresCluster,
) -> None:
    """A cluster from an older version (`trust` for the socket, socket folder 0755): the next
    `up` makes it SCRAM and 0700, and a wrong password over the socket is refused."""
    own_cluster.up()
    own_cluster.down()
    hba = own_cluster.data_dir / "pg_hba.conf"
    hba.write_text(re.sub(r"(?m)^(local\s.*?)scram-sha-256$", r"\1trust", hba.read_text()))
    own_cluster.socket_dir.chmod(0o755)
    assert "trust" in hba.read_text()
    own_cluster.up()
    assert not re.search(r"(?m)^[^#]*\btrust\b", hba.read_text())
    assert own_cluster.socket_dir.stat().st_mode & 0o777 == 0o700
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        psycopg.connect(
            host=str(own_cluster.socket_dir),
            port=own_cluster.port,
            user="postgres",
            dbname="postgres",
            password="wrong",
            connect_timeout=5,
        )


def test_secret_files_are_0600_from_their_first_byte(
    own_cluster: PostgresCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With umask 0, the superuser's and CDC passwords, the server's TLS key and initdb's
    password file are each written through a descriptor whose file is already 0600 (never
    written, then chmod'ed); the key and initdb's file are the server user's before that."""
    writes: list[tuple[Path, os.stat_result]] = []
    write = os.write

    def spy(descriptor: int, data: bytes) -> int:
        status = os.fstat(descriptor)
        if stat.S_ISREG(status.st_mode):
            # The path the descriptor names at the write, not its inode: a secret is written
            # to a partial file linked in place, and a removed file's inode may be reused.
            writes.append((Path(os.readlink(f"/proc/self/fd/{descriptor}")), status))
        return write(descriptor, data)

    monkeypatch.setattr(os, "write", spy)
    previous = os.umask(0)
    try:
        own_cluster.up()
        own_cluster.cdc_password()
    finally:
        os.umask(previous)

    def written_to(path: Path) -> list[tuple[int, int, int]]:
        """Each write to ``path`` or to a partial file then put in its place: (mode, size,
        uid)."""
        target = path.resolve()
        return [
            (status.st_mode & 0o777, status.st_size, status.st_uid)
            for written, status in writes
            if written.parent == target.parent
            and (
                written == target
                or (f".{target.name}." in written.name and written.suffix == ".partial")
            )
        ]

    def first_write(path: Path) -> list[tuple[int, int, int]]:
        return written_to(path)[:1]

    for secret in (own_cluster.password_file, own_cluster.home / "cdc.password"):
        first = first_write(secret)
        assert first, f"{secret} was not written through a descriptor of its own"
        assert first[0][:2] == (0o600, 0), secret
        assert secret.stat().st_mode & 0o777 == 0o600
    server_uid = pwd.getpwnam("postgres").pw_uid if os.geteuid() == 0 else os.geteuid()
    assert first_write(own_cluster.tls_files.server_key) == [(0o600, 0, server_uid)], (
        "the server's TLS key: 0600 and the server user's before its first byte"
    )
    assert written_to(own_cluster.server_home / ".initdb-pwfile") == [(0o600, 0, server_uid)], (
        "initdb's password file: 0600 and the server user's before its first byte"
    )
    assert not list(own_cluster.server_home.glob(".initdb-pwfile*")), "removed after initdb"


def test_connect_gets_only_the_variables_it_needs(kafka_services: KafkaServices) -> None:
    """The worker's environment is an allow-list plus the connector's secret, and `${env:…}`
    in a connector config resolves that secret only: PATH, which the worker has, stays
    unresolved when Connect's REST API validates a config (which resolves providers). The
    probe is Debezium's connector, the worker's one plugin (Kafka's FileStream connectors are
    not on its class path; it reports no values, but its check of ``topic.prefix`` echoes
    the value it got)."""
    pid = kafka_services.connect.process.pid()
    assert pid is not None
    names = {
        entry.split(b"=", 1)[0].decode()
        for entry in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        if entry
    }
    assert "OUTBOX_CONNECT_DATABASE_PASSWORD" in names and "PATH" in names
    assert names <= set(INHERITED_VARIABLES) | set(CONNECTOR_SECRETS), names

    def resolved(variable: str) -> bool:
        """Whether Connect resolved ``${env:variable}`` when validating a config. Debezium's
        connector (the worker has no other plugin) hides values in its answer, but names an
        unresolved placeholder in the error of a host name field, which takes no ``$``."""
        placeholder = f"${{env:{variable}}}"
        answer = kafka_services.connect.client.request(
            "PUT",
            "/connector-plugins/PostgresConnector/config/validate",
            {
                "connector.class": "io.debezium.connector.postgresql.PostgresConnector",
                "name": "probe",
                "database.hostname": placeholder,
            },
        )
        (errors,) = [
            item["value"]["errors"]
            for item in answer["configs"]
            if item.get("value") and item["value"]["name"] == "database.hostname"
        ]
        return not any(placeholder in error for error in errors)

    assert not resolved("PATH"), "a variable outside the allow-list was read"
    assert resolved("OUTBOX_CONNECT_DATABASE_PASSWORD"), "the connector's secret was not read"
