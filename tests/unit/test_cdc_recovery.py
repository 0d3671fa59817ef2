"""chaos/cdc_recovery.py's own decisions, without services: its rounds replay from their seed,
it reads how long Connect's start-up read of its offsets topic took from Connect's log, it
finds the transactional ids in kafka-transactions.sh's listing, its summary counts a round
that never recovered as a failure, its extra loggers keep the stack's own lines, it reads the
relay's counters from its metrics page, and it holds the lake to every committed event once,
in commit order per aggregate."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import typer

from chaos.cdc_recovery import (
    LAKE_TOPIC_PATTERN,
    Committed,
    FaultKind,
    Kinds,
    PlannedRound,
    RoundResult,
    compare_lake,
    debug_log4j2,
    metric_samples,
    offsets_reads,
    override,
    plan_rounds,
    properties,
    summary_lines,
    transactional_ids,
    unblock_lines,
)


def test_rounds_replay_from_their_seed_and_alternate_with_pauses() -> None:
    rounds = plan_rounds(6, kinds=Kinds.BOTH, seed=7)
    assert rounds == plan_rounds(6, kinds=Kinds.BOTH, seed=7)
    assert rounds != plan_rounds(6, kinds=Kinds.BOTH, seed=8)
    assert [r.kind for r in rounds] == [FaultKind.KILL, FaultKind.PAUSE] * 3
    assert [r.number for r in rounds] == [1, 2, 3, 4, 5, 6]
    assert all(20 <= r.hold_seconds <= 40 for r in rounds if r.kind is FaultKind.PAUSE)
    assert all(1 <= r.hold_seconds <= 5 for r in rounds if r.kind is FaultKind.KILL)
    assert all(3 <= r.settle_seconds <= 8 for r in rounds)
    assert {r.kind for r in plan_rounds(4, kinds=Kinds.KILL, seed=7)} == {FaultKind.KILL}
    only_pauses = plan_rounds(20, kinds=Kinds.PAUSE, seed=7)
    assert [r.kind for r in only_pauses] == [FaultKind.PAUSE] * 20
    assert all(20 <= r.hold_seconds <= 40 for r in only_pauses)
    fixed = plan_rounds(4, kinds=Kinds.BOTH, seed=7, down=55.0)
    assert [r.hold_seconds for r in fixed if r.kind is FaultKind.KILL] == [55.0, 55.0]
    assert [r.hold_seconds for r in fixed if r.kind is FaultKind.PAUSE] == [
        r.hold_seconds for r in rounds[:4] if r.kind is FaultKind.PAUSE
    ]


OFFSETS, STATUS = "outbox-connect-offsets", "outbox-connect-status"
SOURCE = "(org.apache.kafka.connect.util.KafkaBasedLog)"


def started(at: str, topic: str) -> str:
    return f"[2026-11-28 {at}] INFO Starting KafkaBasedLog with topic {topic} report... {SOURCE}"


def finished(at: str, topic: str) -> str:
    return f"[2026-11-28 {at}] INFO Finished reading KafkaBasedLog for topic {topic} {SOURCE}"


LOG = [
    started("16:18:26,228", OFFSETS),
    "[2026-11-28 16:18:26,229] INFO AdminClientConfig values:",
    "\tbootstrap.servers = [127.0.0.1:9092]",
    finished("16:19:12,051", OFFSETS),
    started("16:19:12,060", STATUS),
    finished("16:19:12,100", STATUS),
    started("16:19:13,171", OFFSETS),
    finished("16:19:13,286", OFFSETS),
    started("16:19:20,000", OFFSETS),
]


def test_each_read_of_the_offsets_topic_is_timed_and_an_unfinished_one_is_none() -> None:
    assert offsets_reads(LOG) == [45.823, 0.115, None]
    assert offsets_reads(LOG, STATUS) == [0.04]
    assert offsets_reads([]) == []
    overlapping = [
        started("16:00:00,000", OFFSETS),
        started("16:00:01,000", OFFSETS),
        finished("16:00:01,500", OFFSETS),
        finished("16:00:02,000", OFFSETS),
    ]
    assert offsets_reads(overlapping) == [1.5, 1.0]


def test_the_transactional_ids_of_the_listing_are_its_first_column() -> None:
    listing = (
        "$ ... list (exit 0)\n"
        "TransactionalId                 Coordinator ProducerId TransactionState\n"
        "outbox-connect-cdc-recovery-0   1           1          Ongoing\n"
        "connect-cluster-outbox-connect  1           0          CompleteCommit\n"
    )
    assert transactional_ids(listing) == [
        "outbox-connect-cdc-recovery-0",
        "connect-cluster-outbox-connect",
    ]
    assert transactional_ids("Exception in thread main: timed out\n") == []


def _result(number: int, kind: FaultKind, recovery: float | None) -> RoundResult:
    return RoundResult(
        PlannedRound(number, kind, 2.0, 3.0),
        recovery_seconds=recovery,
        bound_seconds=120.0,
        offsets_reads=[1.5, 0.1] if kind is FaultKind.KILL else [],
        evidence=Path("/tmp/round") if recovery is None or recovery > 120 else None,
    )


def test_the_summary_counts_late_and_missing_probes_as_failures() -> None:
    results = [
        _result(1, FaultKind.KILL, 8.0),
        _result(2, FaultKind.PAUSE, 4.0),
        _result(3, FaultKind.KILL, 130.0),
        _result(4, FaultKind.PAUSE, None),
    ]
    assert [r.ok for r in results] == [True, True, False, False]
    lines = summary_lines(results, exits=["16:00:00 Connect: pid 1 exited"], writer="10 events")
    assert lines[0] == "rounds: 4 (kill 2, pause 2); failures: 2"
    assert lines[1].startswith("  round 3 (kill): probe on Kafka: 130.0 s")
    assert lines[2].startswith("  round 4 (pause): probe on Kafka: never")
    assert (
        "recovery (all, probe on Kafka after both back): min 4.0 s, p50 8.0 s, max 130.0 s; "
        "1 never" in lines
    )
    assert (
        "recovery (kill, probe on Kafka after both back): min 8.0 s, p50 69.0 s, max 130.0 s"
        in lines
    )
    assert "2 of 4 rounds recovered within the bound (120 s)" in lines
    assert "  round  4 pause recovery   never FAILED" in lines
    assert "2 of 5 rounds recovered within the bound (120 s)" in summary_lines(
        results, exits=[], writer="", planned=5
    )
    assert "unplanned exits: 16:00:00 Connect: pid 1 exited" in lines
    held = _result(5, FaultKind.KILL, 9.0)
    held.readers_held = ["outbox.event.load[0]: transaction of producer 1 ... hanging"]
    assert not held.ok and "readers held: outbox.event.load[0]" in held.line()
    assert "  rounds leaving read_committed readers of an outbox topic held: 1" in summary_lines(
        [held], exits=[], writer=""
    )
    assert "round 3 kill (down 2 s)" in results[2].line()
    assert "FAILED" in results[2].line() and "FAILED" not in results[0].line()


def test_the_extra_loggers_come_after_the_stacks_own_lines() -> None:
    text = debug_log4j2("rootLogger.level = info", {"a.b": "debug", "c": "info"})
    assert text.splitlines() == [
        "rootLogger.level = info",
        "logger.cdcrecovery0.name = a.b",
        "logger.cdcrecovery0.level = debug",
        "logger.cdcrecovery1.name = c",
        "logger.cdcrecovery1.level = info",
    ]


def test_a_candidate_setting_goes_on_top_of_the_stacks_own() -> None:
    class Service:
        def server_properties(self) -> dict[str, str]:
            return {"a": "1", "b": "2"}

    override(Service, "server_properties", properties(["b = 3", "c=x=y"]))
    assert Service().server_properties() == {"a": "1", "b": "3", "c": "x=y"}
    with pytest.raises(typer.BadParameter):
        properties(["no-equals-sign"])


def _relay_round(
    number: int, kind: FaultKind, recovery: float | None, unblocked: int | None
) -> RoundResult:
    return RoundResult(
        PlannedRound(number, kind, 2.0, 3.0),
        recovery_seconds=recovery,
        bound_seconds=180.0,
        by_cdc=True,
        probe_seconds=3.5,
        unblocked=unblocked,
        took_over=True,
    )


def test_with_the_relay_a_round_is_judged_by_cdc_and_says_whether_the_relay_unblocked() -> None:
    results = [
        _relay_round(1, FaultKind.KILL, 95.0, 1),
        _relay_round(2, FaultKind.PAUSE, 12.0, 0),
        _relay_round(3, FaultKind.KILL, 181.0, None),
    ]
    assert [r.ok for r in results] == [True, True, False]
    line = results[0].line()
    assert "probe on Kafka 3.5 s, CDC confirmed its WAL 95.0 s after both back" in line
    assert "relay unblocked Connect: yes (1), took over: yes: ok" in line
    assert "relay unblocked Connect: no" in results[1].line()
    assert "unknown (no metrics)" in results[2].line() and "FAILED (bound 180 s)" in (
        results[2].line()
    )
    lines = summary_lines(results, exits=[], writer="", planned=3)
    assert "  round 3 (kill): CDC confirming the probe's WAL: 181.0 s (bound 180 s)" in lines[1]
    assert (
        "recovery (all, CDC confirming the probe's WAL after both back): "
        "min 12.0 s, p50 95.0 s, max 181.0 s" in lines
    )
    assert (
        "  round  1 kill  recovery  95.0 s, relay unblocked Connect: yes (1), took over: yes"
        in lines
    )
    assert "relay unblocked Connect in 1 of 3 rounds (rounds 1)" in lines
    assert "2 of 3 rounds recovered within the bound (180 s)" in lines


def test_the_relays_counters_come_from_its_metrics_page_and_its_unblocks_from_its_log() -> None:
    page = (
        "# HELP outbox_relay_connect_unblocked_total Hanging transactions...\n"
        "# TYPE outbox_relay_connect_unblocked_total counter\n"
        "outbox_relay_connect_unblocked_total 2.0\n"
        "outbox_relay_connect_unblocked_created 1.7e+09\n"
        'outbox_relay_mode{mode="auto"} 1.0\n'
        "outbox_relay_leader 1.0\n"
    )
    samples = metric_samples(page)
    assert samples["outbox_relay_connect_unblocked_total"] == 2.0
    assert samples['outbox_relay_mode{mode="auto"}'] == 1.0
    assert samples["outbox_relay_leader"] == 1.0
    log = (
        '{"level": "INFO", "message": "leader: this replica relays the outbox now"}\n'
        '{"level": "WARNING", "message": "aborted a hanging transaction that held Kafka '
        'Connect: outbox-connect-offsets[0]: producer 7"}\n'
        "not json: aborted a hanging transaction\n"
    )
    assert unblock_lines(log) == [
        "aborted a hanging transaction that held Kafka Connect: outbox-connect-offsets[0]: "
        "producer 7",
        "not json: aborted a hanging transaction",
    ]


LOAD, PROBE = "recoveryload", "recoveryprobe"


def _row(
    event_id: str, aggregate: str, position: int | None, kind: str = LOAD
) -> dict[str, object]:
    return {
        "event_id": event_id,
        "aggregate_type": kind,
        "aggregate_id": aggregate,
        "position": position,
    }


COMMITTED = [
    Committed("a1", LOAD, "1"),
    Committed("b1", LOAD, "2"),
    Committed("a2", LOAD, "1"),
    Committed("p1", PROBE, "1"),
    Committed("a3", LOAD, "1"),
]


def test_the_lake_holds_every_committed_event_once_in_commit_order() -> None:
    lake = [
        _row("a3", "1", 30),
        _row("a1", "1", 10),
        _row("b1", "2", 11),
        _row("a2", "1", 20),
        _row("p1", "1", 21, PROBE),
        _row("u1", "3", 40),  # its commit raised: it may be there
    ]
    check = compare_lake(COMMITTED, {"u1", "u2"}, lake)
    assert check.ok
    assert check.line() == (
        "lake: 5 committed, 5 in the lake once, 0 missing, 0 doubled; 2 unknown (1 in the "
        "lake); order per aggregate (position): 3 aggregates, 0 out of commit order"
    )
    assert check.details() == []


def test_the_lake_fails_on_a_missing_a_doubled_a_stray_or_a_reordered_event() -> None:
    lake = [
        _row("a1", "1", 20),  # after a2: out of commit order
        _row("a2", "1", 10),
        _row("b1", "2", 11),
        _row("b1", "2", 11),  # twice
        _row("u1", "3", 40),
        _row("u1", "3", 40),  # an unknown one, twice: never allowed
        _row("zz", "9", 50),  # never written
        _row("p1", "1", 21, PROBE),
    ]
    check = compare_lake(COMMITTED, {"u1"}, lake)
    assert not check.ok
    assert check.missing == ["a3"]
    assert check.doubled == ["b1", "u1"]
    assert check.stray == ["zz"]
    assert check.out_of_order == [f"{LOAD}/1"]
    assert check.once == 3
    assert check.line().startswith("lake: 5 committed, 3 in the lake once, 1 missing, 2 doubled")
    assert "  missing: a3" in check.details()
    assert compare_lake(COMMITTED, set(), []).missing == ["a1", "b1", "a2", "p1", "a3"]


def test_without_positions_the_order_is_said_not_checked() -> None:
    lake = [
        _row(event.event_id, event.aggregate_id, None, event.aggregate_type) for event in COMMITTED
    ]
    check = compare_lake(COMMITTED, set(), lake)
    assert check.ok and check.order_checked is None
    assert check.line().endswith("; order not checked (no position)")


def test_the_lake_ingests_only_the_load_and_the_probes() -> None:
    pattern = re.compile(LAKE_TOPIC_PATTERN)
    assert pattern.search("outbox.event.recoveryload")
    assert pattern.search("outbox.event.recoveryprobe")
    assert not pattern.search("outbox.event.recoveryloadx")
    assert not pattern.search("cdcrecovery.outbox.outbox_heartbeat")
    assert not pattern.search("outbox.event.other")
