"""The replication slot keeps no more WAL than needed while the outbox is idle and another
table of the same database is busy: the connector's heartbeat action inserts a row into the
outbox's heartbeat table (in the publication), whose change event moves the slot on."""

from __future__ import annotations

import time

import pytest

from tests.fix_cdc import CdcPath

pytestmark = pytest.mark.timeout(180)

MB = 1024 * 1024


def wal_position(cdc: CdcPath) -> tuple[int, int]:
    """(WAL written so far, WAL the slot still retains), in bytes."""
    with cdc.database.connect() as connection:
        row = connection.execute(
            "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint, "
            "pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::bigint "
            "FROM pg_replication_slots WHERE slot_name = %s",
            (cdc.connector.slot_name,),
        ).fetchone()
    assert row is not None, "the connector's slot is missing"
    return int(row[0]), int(row[1])


def test_slot_wal_stays_bounded_while_the_outbox_is_idle(cdc: CdcPath) -> None:
    """About 60 MB of WAL from another table at a steady ~3 MB/s with no outbox event: the
    slot keeps well under half of it at any time, and catches up once the load stops.
    (Without the heartbeat table it would keep all of it.)"""
    with cdc.database.connect() as connection:
        connection.execute("CREATE TABLE IF NOT EXISTS busy_table (filler text NOT NULL)")
        connection.commit()
        start, _ = wal_position(cdc)
        worst = 0
        written = start
        pace = time.monotonic()
        while written - start < 60 * MB:
            with connection.transaction():
                connection.execute(
                    "INSERT INTO busy_table SELECT repeat('x', 1000) FROM generate_series(1, 1000)"
                )
            written, retained = wal_position(cdc)
            worst = max(worst, retained)
            pace += 0.4  # load shaping: about 3 MB/s of WAL, not a wait for a condition
            time.sleep(max(0.0, pace - time.monotonic()))
    assert worst < 0.5 * (written - start), f"the slot retained up to {worst / MB:.1f} MB"
    settle = time.monotonic() + 30
    while wal_position(cdc)[1] > 4 * MB:
        assert time.monotonic() < settle, "the slot did not catch up with an idle outbox"
        time.sleep(0.2)
