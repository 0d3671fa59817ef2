"""The CDC path under faults: Connect killed, the broker paused, PostgreSQL restarted, all
while an application writes. Nothing committed may be lost; duplicates carry the same id."""

from __future__ import annotations

import signal
import time
import uuid
from collections.abc import Callable

import pytest

from outbox.core.contract import event_id_of, topic_for
from tests.fix_cdc import CdcPath
from tests.writers import Writer

pytestmark = pytest.mark.timeout(300)


def committed_ids(cdc: CdcPath, aggregate_type: str) -> set[uuid.UUID]:
    with cdc.database.connect() as connection:
        return {
            row[0]
            for row in connection.execute(
                "SELECT id FROM outbox.outbox WHERE aggregatetype = %s", (aggregate_type,)
            )
        }


def run_with_fault(cdc: CdcPath, fault: Callable[[], None], batches: int = 300) -> None:
    aggregate_type = f"f{uuid.uuid4().hex[:10]}"
    writer = Writer(cdc.database.conninfo, aggregate_type, batches)
    writer.start()
    writer.wait_for(batches // 4)
    fault()
    writer.join(timeout=200)
    assert not writer.is_alive() and not writer.errors, writer.errors
    assert writer.done_batches == batches
    expected = committed_ids(cdc, aggregate_type)
    assert len(expected) >= batches * 10

    def ids(records: list[object]) -> set[uuid.UUID]:
        return {event_id_of(m.headers) for m in records}  # type: ignore[attr-defined]

    received = cdc.consume_until(
        topic_for(aggregate_type), lambda records: ids(records) >= expected, timeout=120
    )
    seen = ids(received)
    assert seen == expected, f"{len(expected - seen)} committed events never arrived"
    assert len(received) >= len(expected)  # duplicates are allowed, with the same id


def test_no_loss_when_connect_is_killed(cdc: CdcPath) -> None:
    def kill_and_restart_connect() -> None:
        cdc.kafka.connect.process.signal(signal.SIGKILL)
        deadline = time.monotonic() + 30
        while cdc.kafka.connect.process.is_running():
            assert time.monotonic() < deadline
            time.sleep(0.1)
        cdc.kafka.start_connect()
        cdc.client.wait_running(cdc.connector.name, timeout=120)

    run_with_fault(cdc, kill_and_restart_connect)


def test_no_loss_when_the_broker_is_paused_for_20_seconds(cdc: CdcPath) -> None:
    def pause_broker() -> None:
        cdc.kafka.broker.process.signal(signal.SIGSTOP)
        try:
            time.sleep(20)  # the fault itself: the broker frozen for 20 s while writes go on
        finally:
            cdc.kafka.broker.process.signal(signal.SIGCONT)

    run_with_fault(cdc, pause_broker)


def test_no_loss_when_postgres_restarts(cdc: CdcPath) -> None:
    def restart_postgres() -> None:
        cdc.database.cluster.restart()
        state = cdc.client.state(cdc.connector.name)
        if state is not None and state.failed_tasks:
            cdc.client.restart(cdc.connector.name)
        cdc.client.wait_running(cdc.connector.name, timeout=120)

    run_with_fault(cdc, restart_postgres)
