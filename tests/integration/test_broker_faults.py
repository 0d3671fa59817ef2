"""The local broker (Apache Kafka, one KRaft node) and Kafka Connect under faults, while
applications commit concurrently and CDC streams: the broker killed (``kill -9``) and
restarted, the broker paused, Connect killed. Nothing committed is lost, every aggregate's
first copies on Kafka are in commit (position) order, and with Connect's exactly-once source
mode a ``read_committed`` reader sees no event twice after a Connect crash. The last test runs
the relay in auto mode and the lake job through the crash of both: every event lands once.

These tests use a broker and a Connect worker of their own (``durable_services``), so the
session's services, which the rest of the suite shares, are never killed.
"""

from __future__ import annotations

import signal
import time
import uuid
import warnings
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

import outbox_migrations
from outbox.core.contract import event_id_of, topic_for
from outbox.kafka_reading import KafkaReader, ReaderRole
from outbox_connect.client import ConnectClient
from outbox_stack.process import ServiceProcess
from tests.cli import run_outbox
from tests.fix_cdc import CdcPath, cdc_path_for
from tests.fix_lake import ingested, lake_env, rows
from tests.fix_postgres import ScratchDatabase
from tests.fix_relay import RelayBench, wait_until
from tests.fix_stack import KafkaServices
from tests.hanging_transaction import leave_hanging_transaction
from tests.integration.test_relay_faults import check_delivery, sample
from tests.kafka_read import read_until
from tests.writers import Writer

pytestmark = pytest.mark.timeout(480)

WRITERS = 3
"""Applications committing at once, each on aggregates of its own type (topic)."""


@pytest.fixture(scope="module")
def durable_cdc(durable_services: KafkaServices) -> Iterator[CdcPath]:
    db = ScratchDatabase(durable_services.cluster, f"outbox_test_faults_{uuid.uuid4().hex[:8]}")
    db.cluster.ensure_database(db.name)
    engine = sa.create_engine(db.url)
    with engine.begin() as connection:
        outbox_migrations.upgrade(connection)
    engine.dispose()
    with cdc_path_for(durable_services, db) as path:
        yield path
    db.cluster.drop_database(db.name)


def kill(process: ServiceProcess) -> None:
    process.signal(signal.SIGKILL)
    wait_until(lambda: not process.is_running(), timeout=30, what=f"{process.name} gone")


def start_writers(cdc: CdcPath) -> list[Writer]:
    writers = [
        Writer(cdc.database.conninfo, f"w{uuid.uuid4().hex[:10]}", batches=150, pace_seconds=0.02)
        for _ in range(WRITERS)
    ]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.wait_for(30)
    return writers


def finish(cdc: CdcPath, writers: list[Writer], tmp_path: Path) -> list[list[Any]]:
    """Wait for the connector and the writers; check every writer's events on Kafka."""
    cdc.kafka.wait_connector_running(cdc.connector.name, timeout=180)
    for writer in writers:
        writer.join(timeout=200)
    bench = RelayBench(cdc.database, cdc.kafka, tmp_path)
    return [check_delivery(bench, writer) for writer in writers]


def connector_back_after_crash(kafka: KafkaServices, name: str) -> None:
    """Wait for the connector after both the broker and Connect crashed. In one whole run of
    four the restarted worker answered REST but had no status for the connector for three
    minutes; a chaos run's log later showed a worker stuck reading Connect's offsets topic,
    which a transaction left open there does (see ``test_a_hanging_transaction_...``). Then
    the operator's remedies (docs/troubleshooting.md) are applied, and what was found is
    reported: ``outbox connect unblock`` if a hanging transaction holds the topic, else a
    restart of Connect."""
    try:
        kafka.wait_connector_running(name, timeout=150)
    except AssertionError as stuck:
        aborted = kafka.unblock_connect()
        if aborted:
            found = "; ".join(t.describe() for t in aborted)
            warnings.warn(f"hanging transaction aborted: {found}\n{stuck}", stacklevel=2)
        else:
            warnings.warn(f"Connect restarted a second time: {stuck}", stacklevel=2)
            kafka.connect.down()
            kafka.start_connect()
        kafka.wait_connector_running(name, timeout=150)


def duplicates(records: list[Any]) -> list[uuid.UUID]:
    counts = Counter(event_id_of(record.headers) for record in records)
    return [event_id for event_id, count in counts.items() if count > 1]


def test_no_loss_and_order_kept_when_the_broker_is_killed_and_restarted(
    durable_cdc: CdcPath, tmp_path: Path
) -> None:
    kafka = durable_cdc.kafka
    writers = start_writers(durable_cdc)
    kill(kafka.broker.process)
    for writer in writers:
        writer.wait_for(75)  # committed while the broker was down
    kafka.broker.up()
    finish(durable_cdc, writers, tmp_path)


def test_no_loss_and_order_kept_when_the_broker_is_paused(
    durable_cdc: CdcPath, tmp_path: Path
) -> None:
    broker = durable_cdc.kafka.broker.process
    writers = start_writers(durable_cdc)
    broker.signal(signal.SIGSTOP)
    try:
        for writer in writers:
            writer.wait_for(75)  # committed while the broker did not answer
    finally:
        broker.signal(signal.SIGCONT)
    finish(durable_cdc, writers, tmp_path)


def test_no_duplicate_for_a_read_committed_reader_when_connect_is_killed(
    durable_cdc: CdcPath, tmp_path: Path
) -> None:
    """Connect's exactly-once source mode: the records of a batch and the connector's offsets
    commit in one Kafka transaction; a worker killed mid-batch leaves an open transaction,
    which the restarted worker aborts (its producer is fenced by the same transactional id)
    before it resumes from the committed offsets. A read_committed reader sees each event
    once."""
    kafka = durable_cdc.kafka
    writers = start_writers(durable_cdc)
    kill(kafka.connect.process)
    for writer in writers:
        writer.wait_for(75)
    kafka.start_connect()  # the connector comes back from Connect's own topics
    for records in finish(durable_cdc, writers, tmp_path):
        assert duplicates(records) == [], "an event twice for a read_committed reader"


def test_a_read_uncommitted_reader_is_what_exactly_once_protects_against(
    durable_cdc: CdcPath, tmp_path: Path
) -> None:
    """The counterpart of the test above, so that it cannot pass by accident: Connect's records
    are written inside transactions (a read_uncommitted reader reads them too, before and after
    their markers, and a read_committed one never reads past an open transaction)."""
    writer = Writer(durable_cdc.database.conninfo, f"t{uuid.uuid4().hex[:10]}", batches=5)
    writer.run()
    topic = topic_for(writer.aggregate_type)
    committed = read_until(
        durable_cdc.kafka.bootstrap_servers, topic, lambda r: len(r) >= 50, timeout=60
    )
    everything = read_uncommitted(durable_cdc.kafka.bootstrap_servers, topic, 50, timeout=60)
    assert len(committed) == len(everything) == 50
    # A transaction ends with a commit marker, which takes an offset of each partition it
    # wrote: so every partition ends past its last record plus one (however many polls, so
    # transactions, Connect needed; a non-transactional write ends right after it).
    last: dict[int, int] = {}
    for record in committed:
        last[record.partition] = max(last.get(record.partition, -1), record.offset)
    reader = KafkaReader(durable_cdc.kafka.bootstrap_servers, ReaderRole(client_id="tests-markers"))
    try:
        ends = reader.ends([(topic, partition) for partition in last])
    finally:
        reader.close()
    unmarked = {p: (at, ends[(topic, p)]) for p, at in last.items() if ends[(topic, p)] < at + 2}
    assert not unmarked, (
        f"no commit marker after the last record: Connect is not transactional {unmarked}"
    )


def read_uncommitted(bootstrap: str, topic: str, count: int, *, timeout: float) -> list[Any]:
    """A read_uncommitted reader, on purpose outside the project's reading layer (which reads
    committed records only): what exactly-once protects the project's readers against."""
    import time

    from kafka import KafkaConsumer

    consumer = KafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        isolation_level="read_uncommitted",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        consumer_timeout_ms=500,
    )
    records: list[Any] = []
    deadline = time.monotonic() + timeout
    try:
        while len(records) < count and time.monotonic() < deadline:
            records.extend(consumer)
    finally:
        consumer.close()
    return records


def test_a_hanging_transaction_holds_connect_until_unblocked_and_loses_nothing(
    durable_cdc: CdcPath, tmp_path: Path
) -> None:
    """A hanging transaction (KIP-664: no coordinator counts it as open, so Kafka never ends
    it) on Connect's offsets topic holds an exactly-once worker at start-up: restarted, it
    answers REST but starts no connector, as the restarted workers of two failed runs did.
    ``outbox connect status`` names it and exits 1; ``outbox connect unblock`` aborts it; the
    worker then starts the connector, and CDC delivers every event committed meanwhile."""
    kafka = durable_cdc.kafka
    name = durable_cdc.connector.name
    leave_hanging_transaction(kafka.bootstrap_servers, kafka.offsets_topic)
    kill(kafka.connect.process)
    kafka.start_connect()  # REST answers...
    writers = start_writers(durable_cdc)
    client = ConnectClient(kafka.connect.rest_url)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:  # ...but no connector starts while the topic is held
        assert client.state(name) is None, "the worker started past a hanging transaction"
        time.sleep(1)

    env = {
        "OUTBOX_CONNECT_URL": kafka.connect.rest_url,
        "OUTBOX_CONNECT_NAME": name,
        "OUTBOX_CONNECT_OFFSETS_TOPIC": kafka.offsets_topic,
        "OUTBOX_KAFKA_BOOTSTRAP_SERVERS": kafka.bootstrap_servers,
    }
    status = run_outbox("connect", "status", env=env)
    assert status.returncode == 1, status.stdout + status.stderr
    assert f"{kafka.offsets_topic}[0]: transaction of producer" in status.stdout
    assert "hanging" in status.stdout and "outbox connect unblock" in status.stdout
    unblocked = run_outbox("connect", "unblock", "--idle-seconds", "0", env=env)
    assert unblocked.returncode == 0, unblocked.stdout + unblocked.stderr
    assert unblocked.stdout.startswith(f"aborted: {kafka.offsets_topic}[0]"), unblocked.stdout
    finish(durable_cdc, writers, tmp_path)  # the connector runs, nothing is lost
    assert not any(t.hanging for t in kafka.offsets_topic_transactions())


def test_the_relay_unblocks_connect_by_itself_and_cdc_comes_back(
    durable_cdc: CdcPath, tmp_path: Path
) -> None:
    """The same hanging transaction, no operator: the relay in auto mode takes over when CDC
    does not deliver, finds the hanging transaction on Connect's offsets topic and aborts
    it; the held worker then starts the connector, CDC delivers again, nothing is lost."""
    kafka = durable_cdc.kafka
    name = durable_cdc.connector.name
    leave_hanging_transaction(kafka.bootstrap_servers, kafka.offsets_topic)
    kill(kafka.connect.process)
    kafka.start_connect()
    bench = RelayBench(durable_cdc.database, kafka, tmp_path)
    with bench.in_thread(
        cdc_topic_prefix=durable_cdc.connector.topic_prefix,
        mode="auto",
        grace_seconds=3.0,
        connect_offsets_topic=kafka.offsets_topic,
        connect_unblock_idle_seconds=0.0,  # the transaction is ours: no margin needed here
    ) as relay:
        writers = start_writers(durable_cdc)
        kafka.wait_connector_running(name, timeout=150)  # no `outbox connect unblock`
        assert sample(relay, "outbox_relay_connect_unblocked_total") >= 1
        for writer in writers:
            writer.join(timeout=200)
        wait_until(lambda: bench.undelivered() == 0, timeout=180, what="all delivered")
        after = _current_wal(durable_cdc)
        wait_until(
            lambda: _slot_confirmed(durable_cdc) >= after,
            timeout=120,
            what="CDC confirming WAL written after the relay unblocked Connect",
        )
    for writer in writers:
        check_delivery(bench, writer)
    assert not any(t.hanging for t in kafka.offsets_topic_transactions())


def _current_wal(cdc: CdcPath) -> int:
    with cdc.database.connect() as connection:
        row = connection.execute("SELECT (pg_current_wal_lsn() - '0/0'::pg_lsn)::bigint").fetchone()
    assert row is not None
    return int(row[0])


def _slot_confirmed(cdc: CdcPath) -> int:
    """Where the connector's slot is confirmed up to (bytes of WAL; -1 without it)."""
    with cdc.database.connect() as connection:
        row = connection.execute(
            "SELECT (confirmed_flush_lsn - '0/0'::pg_lsn)::bigint FROM pg_replication_slots "
            "WHERE slot_name = %s",
            (cdc.connector.slot_name,),
        ).fetchone()
    return -1 if row is None or row[0] is None else int(row[0])


@pytest.mark.timeout(660)
def test_no_loss_no_lake_duplicate_when_broker_and_connect_are_both_killed(
    durable_cdc: CdcPath, tmp_path: Path
) -> None:
    """With the relay in auto mode and the lake job: the lake ingests before the crash and
    resumes from its checkpoint after it (those offsets still exist); every committed event
    lands once."""
    kafka = durable_cdc.kafka
    bench = RelayBench(durable_cdc.database, kafka, tmp_path)
    auto = {"mode": "auto", "grace_seconds": 3.0}
    cdc_topic_prefix = durable_cdc.connector.topic_prefix
    prefix = f"l{uuid.uuid4().hex[:8]}"
    lake = tmp_path / "lake"
    with bench.in_thread(cdc_topic_prefix=cdc_topic_prefix, **auto) as relay:
        warm = Writer(durable_cdc.database.conninfo, f"{prefix}warm", batches=5)
        warm.run()  # in this thread: the first events, for the lake's first run
        wait_until(lambda: bench.undelivered() == 0, timeout=60, what="CDC confirmed")
        check_delivery(bench, warm)
        env = lake_env(lake, prefix, kafka.bootstrap_servers)
        ingested(env)
        assert len(rows(lake, "events")) >= 50

        writer = Writer(
            durable_cdc.database.conninfo, f"{prefix}order", batches=150, pace_seconds=0.02
        )
        writer.start()
        writer.wait_for(30)
        confirmed = sample(relay, "outbox_relay_cdc_confirmed_total")
        for process in (kafka.broker.process, kafka.connect.process):
            kill(process)
        writer.wait_for(75)
        kafka.broker.up()
        kafka.start_connect()  # the connector comes back from Connect's own topics
        connector_back_after_crash(kafka, durable_cdc.connector.name)
        writer.join(timeout=200)
        wait_until(lambda: bench.undelivered() == 0, timeout=180, what="all confirmed")
        # CDC came back by itself: the slot confirms WAL written after both were back (the
        # connector's heartbeat writes some every second). Not the relay's count of rows CDC
        # confirmed: the relay took over meanwhile and may have deleted every row first.
        after = _current_wal(durable_cdc)
        wait_until(
            lambda: _slot_confirmed(durable_cdc) >= after,
            timeout=120,
            what="CDC confirming WAL written after the broker and Connect came back",
        )
        assert sample(relay, "outbox_relay_cdc_confirmed_total") >= confirmed
    check_delivery(bench, writer)
    ingested(env)
    ids = [str(row["event_id"]) for row in rows(lake, "events")]
    assert len(ids) == len(set(ids)), "no event twice in the lake"
    expected = {str(event_id) for event_id in warm.committed + writer.committed}
    assert expected <= set(ids), f"{len(expected - set(ids))} events missing from the lake"
