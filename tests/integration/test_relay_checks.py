"""Start-up checks: a broken assumption stops the relay with a message that names the fix;
``outbox connect status`` reports how much WAL the slot may keep."""

from __future__ import annotations

import pytest

from tests.cli import run_outbox
from tests.fix_cdc import CdcPath
from tests.fix_relay import RelayBench

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
    result = run_outbox(
        "connect",
        "status",
        env={
            "OUTBOX_CONNECT_URL": connector.url,
            "OUTBOX_CONNECT_NAME": connector.name,
            "OUTBOX_CONNECT_SLOT_NAME": connector.slot_name,
            "OUTBOX_DATABASE_URL": cdc.database.url,
        },
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"slot {connector.slot_name}: active" in result.stdout
    assert "wal_status reserved" in result.stdout
    assert "max_slot_wal_keep_size: unlimited" in result.stdout
    assert "ALTER SYSTEM SET max_slot_wal_keep_size" in result.stdout
