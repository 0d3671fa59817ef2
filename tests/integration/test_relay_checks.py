"""Start-up checks: a broken assumption stops the relay with a message that names the fix;
``outbox connect status`` reports how much WAL the slot may keep, and the relay's ``/metrics``
exports it live."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import pytest
import sqlalchemy as sa
from prometheus_client import generate_latest

import outbox_migrations
from outbox_relay.database import libpq_conninfo
from outbox_relay.metrics import RelayMetrics, SlotWatch
from tests.cli import run_outbox
from tests.fix_cdc import CdcPath
from tests.fix_postgres import ScratchDatabase
from tests.fix_relay import RelayBench, wait_until

pytestmark = pytest.mark.timeout(120)


def relay_env(bench: RelayBench, **extra: str) -> dict[str, str]:
    return {
        "OUTBOX_DATABASE_URL": bench.database.url,
        "OUTBOX_KAFKA_BOOTSTRAP_SERVERS": bench.kafka.bootstrap_servers,
        "OUTBOX_RELAY_HTTP_PORT": "0",
        **extra,
    }


def test_a_cached_position_sequence_stops_the_relay(relay_bench: RelayBench) -> None:
    """With CACHE > 1 the read floor could pass rows not yet visible: never start."""
    with relay_bench.database.connect() as connection:
        connection.execute("ALTER SEQUENCE outbox.outbox_position_seq CACHE 20")
        connection.commit()
    result = run_outbox("relay", "run", env=relay_env(relay_bench), timeout=60)
    assert result.returncode == 2, result.stderr[-2000:]
    assert "CACHE 20" in result.stderr
    assert "ALTER SEQUENCE outbox.outbox_position_seq CACHE 1" in result.stderr


def test_auto_mode_without_the_publication_stops_the_relay(relay_bench: RelayBench) -> None:
    with relay_bench.database.connect() as connection:
        connection.execute("DROP PUBLICATION outbox_publication")
        connection.commit()
    result = run_outbox(
        "relay", "run", env=relay_env(relay_bench, OUTBOX_RELAY_MODE="auto"), timeout=60
    )
    assert result.returncode == 2, result.stderr[-2000:]
    assert "publication outbox_publication does not include outbox.outbox" in result.stderr


def test_connect_status_reports_the_slot_and_its_wal_bound(cdc: CdcPath) -> None:
    connector = cdc.connector
    env = {
        "OUTBOX_CONNECT_URL": connector.url,
        "OUTBOX_CONNECT_NAME": connector.name,
        "OUTBOX_CONNECT_SLOT_NAME": connector.slot_name,
        "OUTBOX_DATABASE_URL": cdc.database.url,
    }
    result = run_outbox("connect", "status", env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"slot {connector.slot_name}: active" in result.stdout
    assert "wal_status reserved" in result.stdout
    assert "max_slot_wal_keep_size: unlimited" in result.stdout
    assert "ALTER SYSTEM SET max_slot_wal_keep_size" in result.stdout
    as_json = run_outbox("connect", "status", "--json", env=env)
    assert as_json.returncode == 0, as_json.stdout + as_json.stderr
    found = json.loads(as_json.stdout)
    assert found["ok"] and found["connector"]["state"] == "RUNNING"
    slot = found["slot"]
    assert (slot["name"], slot["state"], slot["wal_status"]) == (
        connector.slot_name,
        "active",
        "reserved",
    )
    assert slot["unbounded"] and "ALTER SYSTEM SET max_slot_wal_keep_size" in slot["advice"]


def test_relay_roles_granted_before_the_lease_may_lead_after_the_upgrade(
    empty_database: ScratchDatabase,
) -> None:
    role = f"old_relay_{uuid.uuid4().hex[:8]}"
    engine = sa.create_engine(empty_database.url)
    try:
        with engine.begin() as connection:
            outbox_migrations.upgrade(connection, "outbox_0003")
            connection.execute(sa.text(f'CREATE ROLE "{role}"'))
            connection.execute(sa.text(f'GRANT SELECT, DELETE ON outbox.outbox TO "{role}"'))
            outbox_migrations.upgrade(connection)
            allowed = connection.execute(
                sa.text(
                    "SELECT has_table_privilege(:role, 'outbox.outbox_relay_lease', "
                    "'SELECT, INSERT, UPDATE')"
                ),
                {"role": role},
            ).scalar_one()
            connection.execute(sa.text(f'DROP OWNED BY "{role}"'))
            connection.execute(sa.text(f'DROP ROLE "{role}"'))
    finally:
        engine.dispose()
    assert allowed is True


@pytest.mark.parametrize(
    ("takes_away", "told"),
    [
        ('REVOKE ALL ON outbox.outbox_relay_lease FROM "{role}"', "lease table"),
        (  # outbox_0008: a relay that saw only some types would leave the rest undelivered
            "DELETE FROM outbox.outbox_access WHERE role = '{role}'::regrole",
            "the relay must see every type",
        ),
    ],
)
def test_a_role_without_what_the_relay_needs_is_told_how_to_fix_it(
    relay_bench: RelayBench, takes_away: str, told: str
) -> None:
    role = f"relay_{uuid.uuid4().hex[:8]}"
    env = {
        "OUTBOX_DATABASE_URL": relay_bench.database.url,
        "OUTBOX_RELAY_DATABASE_PASSWORD": "r-42",
    }
    created = run_outbox("db", "relay-role", role, env=env)
    assert created.returncode == 0, created.stderr
    with relay_bench.database.connect() as connection:
        connection.execute(takes_away.format(role=role))
        connection.commit()
    cluster = relay_bench.database.cluster
    url = f"postgresql+psycopg://{role}:r-42@127.0.0.1:{cluster.port}/{relay_bench.database.name}"
    try:
        result = run_outbox("relay", "run", env=relay_env(relay_bench, OUTBOX_DATABASE_URL=url))
        assert result.returncode == 2, result.stderr[-2000:]
        assert "outbox db grant ROLE --relay" in result.stderr and told in result.stderr
    finally:
        with relay_bench.database.connect() as connection:
            connection.execute(f'DROP OWNED BY "{role}"')
            connection.execute(f'DROP ROLE "{role}"')
            connection.commit()


@pytest.fixture
def slot_database(empty_database: ScratchDatabase) -> Iterator[tuple[ScratchDatabase, str, str]]:
    """A migrated database with a logical slot nobody reads (a stopped connector's), WAL
    written after it, and the relay's role: (database, slot, the relay role's URL)."""
    slot = f"test_slot_{uuid.uuid4().hex[:8]}"
    role, password = f"relay_{uuid.uuid4().hex[:8]}", "r-42"
    engine = sa.create_engine(empty_database.url)
    with engine.begin() as connection:
        outbox_migrations.upgrade(connection)
        outbox_migrations.create_relay_role(connection, role, password)
    engine.dispose()
    with empty_database.connect(autocommit=True) as connection:
        connection.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
        connection.execute(
            "CREATE TABLE wal_filler AS "
            "SELECT g, repeat('x', 200) AS pad FROM generate_series(1, 20000) g"
        )
    cluster = empty_database.cluster
    url = f"postgresql+psycopg://{role}:{password}@127.0.0.1:{cluster.port}/{empty_database.name}"
    try:
        yield empty_database, slot, url
    finally:
        with empty_database.connect(autocommit=True) as connection:
            connection.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
            connection.execute(f'DROP OWNED BY "{role}"')
            connection.execute(f'DROP ROLE "{role}"')


def sample(text: str, line_start: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(line_start):
            return float(line.rsplit(" ", 1)[1])
    return None


def test_the_relay_exports_the_wal_each_slot_retains_and_its_status(
    slot_database: tuple[ScratchDatabase, str, str],
) -> None:
    """Read as the relay's own role (no grant needed), on a connection of its own: the WAL the
    stopped connector's slot keeps, inactive, wal_status reserved."""
    _, slot, url = slot_database
    watch = SlotWatch(libpq_conninfo(url))
    try:
        watch.refresh()
        text = generate_latest(RelayMetrics(slots=watch.latest).registry).decode()
    finally:
        watch.close()
    retained = sample(text, f'outbox_relay_slot_retained_wal_bytes{{slot="{slot}"}}')
    assert retained is not None and retained > 2_000_000, text
    assert sample(text, f'outbox_relay_slot_active{{slot="{slot}"}}') == 0
    assert sample(text, f'outbox_relay_slot_wal_status{{slot="{slot}",status="reserved"}}') == 1
    assert sample(text, f'outbox_relay_slot_wal_status{{slot="{slot}",status="lost"}}') == 0
    assert sample(text, "outbox_relay_slot_read_ok") == 1


def test_outbox_relay_run_serves_the_slot_metrics(relay_bench: RelayBench) -> None:
    """The command wires the watch in: every replica exports the slots, leader or not."""
    slot = f"test_slot_{uuid.uuid4().hex[:8]}"
    with relay_bench.database.connect(autocommit=True) as connection:
        connection.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
    try:
        relay = relay_bench.process()
        wait_until(
            lambda: (
                relay.metric(f'outbox_relay_slot_wal_status{{slot="{slot}",status="reserved"}}')
                == 1
            ),
            timeout=60,
            what=f"/metrics exports the slot {slot}",
        )
        assert relay.metric("outbox_relay_slot_read_ok") == 1
        assert relay.terminate() == 0
    finally:
        with relay_bench.database.connect(autocommit=True) as connection:
            connection.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
