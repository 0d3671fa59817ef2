"""The private Postgres of the local stack: created, started, probed and stopped by our code."""

from __future__ import annotations

import json
import os
import pwd
import shlex
import shutil
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest
from kafka import KafkaProducer

from outbox.settings import KafkaSettings
from outbox_stack import PostgresCluster, StackSettings
from outbox_stack.broker import KafkaBroker
from outbox_stack.local import LocalStack
from outbox_stack.server_home import outside_home
from tests.cli import run_outbox
from tests.fix_postgres import ROOT, free_port
from tests.kafka_read import read_count

pytestmark = pytest.mark.timeout(180)


@pytest.mark.parametrize("closed_by", ["a parent folder of mode 0700", "a umask of 077"])
def test_a_stack_folder_closed_to_other_users_works(closed_by: str) -> None:
    """A checkout inside a 0700 folder (root's home on Debian), or a stack folder made under a
    umask of 077: as root the server's files go to a folder of the postgres user's, stable
    across runs and named by `stack status`; as any other user they stay in the stack folder.
    Secrets stay in the stack folder."""
    closed = Path(tempfile.mkdtemp(prefix="outbox-closed-"))  # not under pytest's 0700 folder
    closed.chmod(0o700 if closed_by.startswith("a parent") else 0o755)
    previous_umask = os.umask(0o077 if closed_by.startswith("a umask") else 0o022)
    settings = StackSettings(dir=closed / "checkout" / ".stack", postgres_port=free_port())
    cluster = PostgresCluster(settings)
    try:
        try:
            status = cluster.up()
        finally:
            os.umask(previous_umask)
        if os.geteuid() == 0:
            expected = outside_home(settings.root)
            assert expected.parent == Path(pwd.getpwnam("postgres").pw_dir) / "outbox-stack"
            for folder in (expected, expected.parent):
                info = folder.stat()
                assert (info.st_mode & 0o777, pwd.getpwuid(info.st_uid).pw_name) == (
                    0o700,
                    "postgres",
                ), folder
        else:
            expected = settings.root / "postgres"
        assert status.data_dir == expected / "data" and status.running
        assert status.log_file == expected / "postgres.log"
        assert cluster.password_file.parent == settings.root / "postgres"
        again = PostgresCluster(settings)  # a later run finds the same cluster
        assert again.data_dir == status.data_dir and again.pid() == status.pid
        with psycopg.connect(again.conninfo()) as connection:
            assert connection.execute("SELECT 1").fetchone() == (1,)
        shown = run_outbox(
            "stack",
            "status",
            "--json",
            env={"OUTBOX_STACK_DIR": str(settings.dir), **ports_env(settings)},
            timeout=60,
        )
        services = {service["name"]: service for service in json.loads(shown.stdout)["services"]}
        assert services["postgres"]["data"] == str(status.data_dir), shown.stdout
    finally:
        cluster.destroy()
        shutil.rmtree(closed, ignore_errors=True)
    assert not cluster.server_home.exists() and not cluster.home.exists()


def test_a_server_folder_of_your_choice_is_used_and_destroy_keeps_what_is_not_ours() -> None:
    """OUTBOX_STACK_POSTGRES_SERVER_DIR: data, socket and log go there; `destroy` deletes
    only what the server made in it."""
    folder = Path(tempfile.mkdtemp(prefix="outbox-server-"))
    folder.chmod(0o755)
    chosen = folder / "pg"
    chosen.mkdir()
    (chosen / "yours.txt").write_text("not the stack's")
    settings = StackSettings(
        dir=folder / ".stack", postgres_port=free_port(), postgres_server_dir=chosen
    )
    cluster = PostgresCluster(settings)
    try:
        status = cluster.up()
        assert status.data_dir == chosen / "data" and status.socket_dir == chosen / "run"
        assert (chosen / "postgres.log").exists() and status.running
        cluster.destroy()
        assert [path.name for path in chosen.iterdir()] == ["yours.txt"]
    finally:
        cluster.destroy()
        shutil.rmtree(folder, ignore_errors=True)


def ports_env(settings: StackSettings) -> dict[str, str]:
    return {
        "OUTBOX_STACK_POSTGRES_PORT": str(settings.postgres_port),
        "OUTBOX_STACK_BROKER_PORT": str(free_port()),
        "OUTBOX_STACK_BROKER_CONTROLLER_PORT": str(free_port()),
        "OUTBOX_STACK_CONNECT_PORT": str(free_port()),
    }


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


@pytest.mark.timeout(600)
def test_cli_stack_commands(own_cluster: PostgresCluster) -> None:
    """`outbox stack up|status|env|logs|down` over the three services, on ports of its own;
    then, as the README says, from a shell that ran `eval "$(outbox stack env)"` (which
    exports the stack's own broker as
    OUTBOX_KAFKA_BOOTSTRAP_SERVERS): `down` stops that broker and `up` starts it again, it is
    never taken for an external one; a topic written before `down` is there after `up`."""
    settings = StackSettings(
        dir=own_cluster.settings.dir,
        postgres_port=own_cluster.port,
        broker_port=free_port(),
        broker_controller_port=free_port(),
        connect_port=free_port(),
        downloads=ROOT / ".cache" / "stack",
    )
    env = {
        "OUTBOX_STACK_DIR": str(settings.dir),
        "OUTBOX_STACK_POSTGRES_PORT": str(settings.postgres_port),
        "OUTBOX_STACK_BROKER_PORT": str(settings.broker_port),
        "OUTBOX_STACK_BROKER_CONTROLLER_PORT": str(settings.broker_controller_port),
        "OUTBOX_STACK_CONNECT_PORT": str(settings.connect_port),
        "OUTBOX_STACK_DOWNLOADS": str(settings.downloads),
    }

    def outbox(*args: str) -> subprocess.CompletedProcess[str]:
        return run_outbox("stack", *args, env=env, timeout=240)

    def services() -> dict[str, dict[str, Any]]:
        shown = outbox("status", "--json")
        return {service["name"]: service for service in json.loads(shown.stdout)["services"]}

    def after_eval(command: str) -> subprocess.CompletedProcess[str]:
        cli = f"{shlex.quote(sys.executable)} -m outbox_cli.main stack"
        return subprocess.run(
            ["bash", "-c", f'eval "$({cli} env)" && {cli} {command}'],
            env={**os.environ, **env},
            capture_output=True,
            text=True,
            timeout=240,
            check=False,
        )

    stack = LocalStack(settings, KafkaSettings())
    try:
        assert outbox("status").returncode == 1
        started = outbox("up")
        assert started.returncode == 0, started.stderr
        assert "3 of 3 services running" in started.stdout, started.stdout
        first = services()
        for name, address in (
            ("postgres", f"127.0.0.1:{settings.postgres_port}"),
            ("broker", f"kafka://127.0.0.1:{settings.broker_port} (Apache Kafka 4.3.0, KRaft"),
            ("connect", f"http://127.0.0.1:{settings.connect_port}"),
        ):
            assert address in first[name]["address"], first
        assert own_cluster.password() not in started.stdout, "the password is never printed"
        again = outbox("up")
        assert again.returncode == 0
        assert (
            [line.pid for line in stack.status()]
            == [service["pid"] for service in services().values()]
            == [service["pid"] for service in first.values()]
        ), "a second `up` starts nothing"
        status = outbox("status")
        assert status.returncode == 0 and "3 of 3 services running" in status.stdout
        assert all(service["running"] for service in services().values())
        exported = outbox("env").stdout
        assert exported.startswith("export OUTBOX_DATABASE_URL=")
        assert own_cluster.password() in exported
        assert f"OUTBOX_KAFKA_BOOTSTRAP_SERVERS=127.0.0.1:{settings.broker_port}\n" in exported
        # The end of each log (its start may have scrolled past: Connect logs each REST call).
        logs = outbox("logs", "--lines", "2000").stdout
        assert "==> connect <==" in logs and "Kafka Connect started" in logs
        assert "==> broker <==" in logs and "Kafka Server started" in logs
        assert services()["broker"]["data"] == str(stack.own_broker.data_dir), "its data folder"
        assert str(stack.own_broker.data_dir) in status.stdout, "the table names it too"
        topic = f"survives-{uuid.uuid4().hex[:8]}"
        producer = KafkaProducer(bootstrap_servers=stack.bootstrap_servers, acks="all")
        producer.send(topic, b"kept").get(timeout=30)
        producer.close()

        stopped = after_eval("down")
        assert stopped.returncode == 0, stopped.stderr
        assert "external" not in stopped.stdout
        assert not any(line.running for line in stack.status()), "down stopped all three"
        started = after_eval("up")
        assert started.returncode == 0, started.stderr[-3000:]
        assert all(line.running for line in stack.status()), "up started all three"
        assert [r.value for r in read_count(stack.bootstrap_servers, topic, 1)] == [b"kept"]

        stopped = outbox("down")
        assert stopped.returncode == 0
        assert not any(line.running for line in stack.status())
    finally:
        stack.down()


def test_a_bad_port_setting_is_refused_naming_the_variable() -> None:
    result = run_outbox("stack", "status", env={"OUTBOX_STACK_POSTGRES_PORT": "80"}, timeout=60)
    assert result.returncode == 2
    assert "OUTBOX_STACK_POSTGRES_PORT" in result.stderr


@pytest.mark.parametrize(
    ("variable", "value"),
    [("OUTBOX_STACK_BROKER_HEAP", "lots"), ("OUTBOX_STACK_BROKER_CONTROLLER_PORT", "54329")],
)
def test_a_bad_broker_setting_is_refused_naming_the_variable(variable: str, value: str) -> None:
    """A heap Java would not take, or a controller port that is PostgreSQL's."""
    result = run_outbox("stack", "status", env={variable: value}, timeout=60)
    assert result.returncode == 2
    assert variable in result.stderr


def test_the_stack_knows_its_running_broker_by_the_address_it_recorded(tmp_path: Path) -> None:
    """A broker started on one port, then a shell whose settings name another port but whose
    OUTBOX_KAFKA_BOOTSTRAP_SERVERS names the running broker: still the stack's own (`down`
    stops it); a bootstrap server that is not the stack's is external."""
    started_on = StackSettings(
        dir=tmp_path,
        broker_port=free_port(),
        broker_controller_port=free_port(),
        downloads=ROOT / ".cache" / "stack",
    )
    broker = KafkaBroker(started_on)
    broker.up()
    try:
        later = StackSettings(
            dir=tmp_path,
            broker_port=free_port(),
            broker_controller_port=free_port(),
            downloads=ROOT / ".cache" / "stack",
        )
        assert KafkaBroker(later).bootstrap_servers == started_on.bootstrap_servers
        exported = KafkaSettings(bootstrap_servers=f"localhost:{started_on.broker_port}")
        stack = LocalStack(later, exported)
        assert stack.external_kafka is None and stack.broker is not None
        assert stack.bootstrap_servers == started_on.bootstrap_servers
        assert stack.connect.bootstrap_servers == started_on.bootstrap_servers
        external = LocalStack(later, KafkaSettings(bootstrap_servers="kafka.example:9092"))
        assert external.broker is None and external.external_kafka == "kafka.example:9092"
        assert "(external)" in external.status()[1].address
        stack.own_broker.down()
        assert not broker.process.is_running()
    finally:
        broker.down()


def test_commands_find_the_stack_last_started_from_any_folder(tmp_path: Path) -> None:
    """From another folder, without OUTBOX_STACK_DIR: `stack status` and `stack env` find
    the stack `outbox stack up` last started (and say so), `stack env` exports the lake's
    root too, and a lake command that finds no lake says where it looked and how to point
    it elsewhere, instead of printing nothing."""
    from outbox_stack.settings import forget_stack, remember_stack

    settings = StackSettings(dir=tmp_path / "checkout" / ".stack", postgres_port=free_port())
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    cluster = PostgresCluster(settings)
    try:
        cluster.up()
        assert remember_stack(settings) is not None  # as `outbox stack up` does
        ports = ports_env(settings)
        shown = run_outbox(
            "stack", "status", env=ports, cwd=elsewhere, unset=("OUTBOX_STACK_DIR",), timeout=60
        )
        assert f"stack folder {settings.root} (the stack last started" in shown.stdout
        found = json.loads(
            run_outbox(
                "stack",
                "status",
                "--json",
                env=ports,
                cwd=elsewhere,
                unset=("OUTBOX_STACK_DIR",),
                timeout=60,
            ).stdout
        )
        assert found["folder"] == str(settings.root)
        assert found["found"].startswith("the stack last started"), found
        postgres = next(service for service in found["services"] if service["name"] == "postgres")
        assert postgres["running"], found
        exported = run_outbox(
            "stack", "env", env=ports, cwd=elsewhere, unset=("OUTBOX_STACK_DIR",), timeout=60
        )
        assert exported.returncode == 0, exported.stderr
        assert f"OUTBOX_LAKE_ROOT={tmp_path / 'checkout' / '.lake'}" in exported.stdout
        assert f":{settings.postgres_port}/" in exported.stdout
        listed = run_outbox(
            "lake", "tables", cwd=elsewhere, unset=("OUTBOX_LAKE_ROOT",), timeout=60
        )
        assert listed.returncode == 2
        assert f"no lake at {elsewhere / '.lake'} (OUTBOX_LAKE_ROOT is unset" in listed.stderr
        assert 'eval "$(outbox stack env)"' in listed.stderr
    finally:
        cluster.destroy()
        forget_stack(settings)
    nothing = run_outbox(
        "stack", "env", env=ports_env(settings), cwd=elsewhere, unset=("OUTBOX_STACK_DIR",)
    )
    assert nothing.returncode != 0
    assert f"no stack in {elsewhere / '.stack'}" in nothing.stderr
    assert "OUTBOX_STACK_DIR" in nothing.stderr
