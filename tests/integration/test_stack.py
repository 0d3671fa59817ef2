"""The private Postgres of the local stack: created, started, probed and stopped by our code."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from outbox.settings import KafkaSettings
from stack import PostgresCluster, StackError, StackSettings
from stack.local import LocalStack
from tests.cli import run_outbox
from tests.fix_postgres import ROOT, free_port

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def own_cluster() -> Iterator[PostgresCluster]:
    """A second cluster of our own in a temporary folder, on a free port."""
    folder = Path(tempfile.mkdtemp(prefix="outbox-stack-"))
    folder.chmod(0o755)  # the postgres user must reach it when we run as root
    cluster = PostgresCluster(StackSettings(dir=folder, postgres_port=free_port()))
    yield cluster
    cluster.destroy()
    shutil.rmtree(folder, ignore_errors=True)


def test_a_folder_the_postgres_user_cannot_reach_is_explained(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    if os.geteuid() != 0:
        pytest.skip("only root hands the cluster to the postgres user")
    closed = tmp_path_factory.mktemp("closed")
    closed.chmod(0o700)
    cluster = PostgresCluster(StackSettings(dir=closed / "inner", postgres_port=free_port()))
    with pytest.raises(StackError, match="OUTBOX_STACK_DIR"):
        cluster.up()


def test_up_is_idempotent_and_the_cluster_is_ready_for_cdc(own_cluster: PostgresCluster) -> None:
    first = own_cluster.up()
    second = own_cluster.up()
    assert first.running and second.pid == first.pid, "a second `up` starts nothing"
    with psycopg.connect(own_cluster.conninfo()) as connection:
        settings = dict(
            connection.execute(
                "SELECT name, setting FROM pg_settings WHERE name IN "
                "('wal_level', 'max_replication_slots', 'listen_addresses', 'fsync')"
            ).fetchall()
        )
    assert settings["wal_level"] == "logical"
    assert int(settings["max_replication_slots"]) >= 10
    assert settings["listen_addresses"] == "127.0.0.1"
    assert settings["fsync"] == "on"
    assert oct(own_cluster.password_file.stat().st_mode & 0o777) == "0o600"


def test_down_then_up_keeps_the_data(own_cluster: PostgresCluster) -> None:
    own_cluster.up()
    with psycopg.connect(own_cluster.conninfo()) as connection:
        connection.execute("CREATE TABLE kept (x int)")
        connection.execute("INSERT INTO kept VALUES (42)")
    own_cluster.down()
    assert not own_cluster.is_running()
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(own_cluster.conninfo(), connect_timeout=2)
    own_cluster.up()
    with psycopg.connect(own_cluster.conninfo()) as connection:
        assert connection.execute("SELECT x FROM kept").fetchone() == (42,)


def test_the_password_is_required_over_tcp(own_cluster: PostgresCluster) -> None:
    own_cluster.up()
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        psycopg.connect(
            host="127.0.0.1",
            port=own_cluster.port,
            user="postgres",
            password="wrong",
            dbname="postgres",
            connect_timeout=5,
        )


def test_cli_stack_commands(own_cluster: PostgresCluster) -> None:
    """`outbox stack up|status|env|logs|down` over all three services, on ports of its own."""
    settings = StackSettings(
        dir=own_cluster.settings.dir,
        postgres_port=own_cluster.port,
        broker_port=free_port(),
        connect_port=free_port(),
        downloads=ROOT / ".cache" / "stack",
    )
    env = {
        "OUTBOX_STACK_DIR": str(settings.dir),
        "OUTBOX_STACK_POSTGRES_PORT": str(settings.postgres_port),
        "OUTBOX_STACK_BROKER_PORT": str(settings.broker_port),
        "OUTBOX_STACK_CONNECT_PORT": str(settings.connect_port),
        "OUTBOX_STACK_DOWNLOADS": str(settings.downloads),
    }

    def outbox(*args: str) -> subprocess.CompletedProcess[str]:
        return run_outbox("stack", *args, env=env, timeout=240)

    stack = LocalStack(settings, KafkaSettings())
    try:
        assert outbox("status").returncode == 1
        started = outbox("up")
        assert started.returncode == 0, started.stderr
        for address in (
            f"127.0.0.1:{settings.postgres_port}",
            f"kafka://127.0.0.1:{settings.broker_port}",
            f"http://127.0.0.1:{settings.connect_port}",
        ):
            assert address in started.stdout
        assert own_cluster.password() not in started.stdout, "the password is never printed"
        again = outbox("up")
        assert again.returncode == 0
        assert [line.pid for line in stack.status()] == [
            int(pid) for pid in re.findall(r"\(pid (\d+)\)", again.stdout)
        ], "a second `up` starts nothing"
        status = outbox("status")
        assert status.returncode == 0 and status.stdout.count("running") == 3
        exported = outbox("env").stdout
        assert exported.startswith("export OUTBOX_DATABASE_URL=")
        assert own_cluster.password() in exported
        assert f"OUTBOX_KAFKA_BOOTSTRAP_SERVERS='127.0.0.1:{settings.broker_port}'" in exported
        logs = outbox("logs").stdout
        assert "==> connect <==" in logs and "Kafka Connect started" in logs
        stopped = outbox("down")
        assert stopped.returncode == 0
        assert not any(line.running for line in stack.status())
    finally:
        stack.down()


def test_a_bad_port_setting_is_refused_naming_the_variable() -> None:
    result = run_outbox("stack", "status", env={"OUTBOX_STACK_POSTGRES_PORT": "80"}, timeout=60)
    assert result.returncode == 2
    assert "OUTBOX_STACK_POSTGRES_PORT" in result.stderr
