"""Leases under network faults, and auto mode when CDC never produced anything.

One relay talks to PostgreSQL through a TCP proxy (tests/fix_proxy.py) that the test
freezes: its session stays open on the server (no reset reaches it), as on a network that
silently drops packets. The other relay, connected directly, must hold its slices within
``lease_seconds + leader_retry_seconds`` (docs/operations.md) and deliver everything in
per-aggregate order.
"""

from __future__ import annotations

import time
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest

from outbox import Event, Outbox
from outbox.core.contract import event_id_of, topic_for
from outbox_relay.health import HealthServer
from outbox_relay.service import Relay
from outbox_relay.slices import SLICES
from outbox_stack.broker import KafkaBroker
from outbox_stack.settings import StackSettings
from tests.fix_postgres import ROOT, free_port
from tests.fix_proxy import TcpProxy
from tests.fix_relay import RelayBench, sample, wait_until
from tests.integration.test_relay_faults import check_delivery
from tests.kafka_read import read_until
from tests.writers import Writer

pytestmark = pytest.mark.timeout(240)

LEASE_SECONDS = 4.0
RETRY_SECONDS = 0.5


def test_a_relay_cut_off_loses_its_slices_within_the_lease_and_shares_again_after(
    relay_bench: RelayBench, tcp_proxy: Callable[[str, int], TcpProxy]
) -> None:
    """Two relays share the slices; one reaches PostgreSQL through a proxy that is frozen
    under load: the other holds every slice within the lease and delivers the rest; when the
    network returns, the cut-off relay joins again and they share once more."""
    cluster = relay_bench.database.cluster
    proxy = tcp_proxy("127.0.0.1", cluster.port)
    via_proxy = relay_bench.database.url.replace(f":{cluster.port}/", f":{proxy.port}/")
    assert via_proxy != relay_bench.database.url
    timing = {"lease_seconds": LEASE_SECONDS, "leader_retry_seconds": RETRY_SECONDS}
    writer = Writer(
        relay_bench.database.conninfo, f"n{uuid.uuid4().hex[:10]}", batches=300, pace_seconds=0.02
    )

    def shares(*relays: Relay) -> list[float]:
        return [sample(relay, "outbox_relay_slices") for relay in relays]

    with relay_bench.in_thread(database_url=via_proxy, batch_size=50, **timing) as cut:
        wait_until(lambda: shares(cut) == [SLICES], timeout=30, what="the first relay leads")
        with relay_bench.in_thread(batch_size=50, **timing) as other:
            wait_until(lambda: shares(cut, other) == [16, 16], timeout=30, what="they share")
            writer.start()
            writer.wait_for(60)
            wait_until(
                lambda: sample(cut, "outbox_relay_published_total") > 50,
                timeout=30,
                what="the relay to cut off publishes",
            )
            proxy.freeze()
            cut_at = time.monotonic()
            published_at_cut = sample(other, "outbox_relay_published_total")
            wait_until(
                lambda: shares(other) == [SLICES],
                timeout=LEASE_SECONDS + RETRY_SECONDS + 10,
                what="the other relay holds every slice",
            )
            handover = time.monotonic() - cut_at
            with relay_bench.database.connect() as connection:
                row = connection.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE application_name = "
                    "'outbox-relay' AND datname = current_database()"
                ).fetchone()
            assert row is not None and row[0] >= 2, "the cut-off relay's session is gone"
            writer.join(timeout=120)
            wait_until(lambda: relay_bench.undelivered() == 0, timeout=60, what="drained")
            assert sample(other, "outbox_relay_published_total") > published_at_cut
            proxy.drop()  # the network comes back broken: the cut-off relay errs, joins again
            proxy.restore()
            wait_until(lambda: shares(cut, other) == [16, 16], timeout=60, what="they share again")
            lost = sample(cut, "outbox_relay_leases_lost_total")
            assert lost + sample(cut, "outbox_relay_errors_total", kind="database") >= 1
    assert handover < LEASE_SECONDS + RETRY_SECONDS + 2, f"handover took {handover:.1f} s"
    check_delivery(relay_bench, writer)


def test_no_other_role_can_take_leadership(relay_bench: RelayBench) -> None:
    """The advisory lock of old had a well-known key: any role could take it and freeze
    delivery. The lease table is written by the relay role (and the owner) only."""
    role = f"intruder_{uuid.uuid4().hex[:8]}"
    with relay_bench.database.connect(autocommit=True) as admin:
        admin.execute(
            psycopg.sql.SQL("CREATE ROLE {} LOGIN PASSWORD 'x-intruder-1'").format(
                psycopg.sql.Identifier(role)
            )
        )
        admin.execute(
            psycopg.sql.SQL("GRANT USAGE ON SCHEMA outbox TO {}").format(
                psycopg.sql.Identifier(role)
            )
        )
    try:
        as_role = psycopg.conninfo.make_conninfo(
            relay_bench.database.conninfo, user=role, password="x-intruder-1"
        )
        with psycopg.connect(as_role) as intruder:
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                intruder.execute(
                    "INSERT INTO outbox.outbox_relay_lease VALUES "
                    "('leader', gen_random_uuid(), pg_backend_pid(), 1, 1, 'infinity')"
                )
        aggregate_type = f"l{uuid.uuid4().hex[:10]}"
        with relay_bench.database.connect() as connection, connection.transaction():
            Outbox().publish(connection, Event(aggregate_type, "1", "Tick", {}))
        with relay_bench.in_thread():
            wait_until(lambda: relay_bench.undelivered() == 0, timeout=30, what="relayed")
    finally:
        with relay_bench.database.connect(autocommit=True) as admin:
            admin.execute(psycopg.sql.SQL("DROP OWNED BY {}").format(psycopg.sql.Identifier(role)))
            admin.execute(psycopg.sql.SQL("DROP ROLE {}").format(psycopg.sql.Identifier(role)))


def test_auto_mode_takes_over_when_cdc_never_produced(
    relay_bench: RelayBench, tmp_path: Path
) -> None:
    """Connect down from the start: no outbox topic, no heartbeat on a fresh broker. The
    rows must not wait forever, and /readyz must say the relay publishes in CDC's place."""
    settings = StackSettings(
        dir=tmp_path / "stack",
        broker_port=free_port(),
        broker_controller_port=free_port(),  # a fresh broker of its own
        downloads=ROOT / ".cache" / "stack",
    )
    broker = KafkaBroker(settings)
    broker.up()
    try:
        aggregate_type = f"c{uuid.uuid4().hex[:10]}"
        events = [Event(aggregate_type, "1", "Tick", {"n": n}) for n in range(5)]
        with relay_bench.database.connect() as connection, connection.transaction():
            Outbox().publish_many(connection, events)
        with relay_bench.in_thread(
            bootstrap_servers=broker.bootstrap_servers, mode="auto", grace_seconds=1.0
        ) as relay:
            server = HealthServer("127.0.0.1", 0, relay.liveness, relay.metrics)
            server.start()
            try:
                wait_until(lambda: relay_bench.undelivered() == 0, timeout=60, what="took over")
                with urllib.request.urlopen(
                    f"http://127.0.0.1:{server.port}/readyz", timeout=5
                ) as answer:
                    body = answer.read().decode()
            finally:
                server.stop()
            assert sample(relay, "outbox_relay_takeovers_total") == 1
        assert "took over" in body, body
        records = read_until(
            broker.bootstrap_servers, topic_for(aggregate_type), lambda r: len(r) >= 5
        )
        assert [event_id_of(r.headers) for r in records] == [e.event_id for e in events]
    finally:
        broker.down()


def test_the_leaders_session_gives_up_on_a_dead_network_in_seconds(
    relay_bench: RelayBench,
) -> None:
    """Server side (what frees a dead leader's session in PostgreSQL) and client side: TCP
    keepalives after 5 s idle, 3 probes 2 s apart, and tcp_user_timeout = the lease."""
    from outbox import OutboxSettings
    from outbox_relay.database import RelayDatabase

    database = RelayDatabase(relay_bench.database.url, OutboxSettings().tables, 7.0)
    database.connect()
    try:
        shown = {
            name: database.connection.execute(f"SHOW {name}").fetchone()
            for name in (
                "tcp_keepalives_idle",
                "tcp_keepalives_interval",
                "tcp_keepalives_count",
                "tcp_user_timeout",
            )
        }
        info = database.connection.info.get_parameters()
    finally:
        database.close()
    assert shown == {
        "tcp_keepalives_idle": ("5",),
        "tcp_keepalives_interval": ("2",),
        "tcp_keepalives_count": ("3",),
        "tcp_user_timeout": ("7000",),
    }
    assert info["keepalives"] == "1" and info["tcp_user_timeout"] == "7000"
