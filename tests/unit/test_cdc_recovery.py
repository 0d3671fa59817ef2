"""chaos/cdc_recovery.py's own decisions, without services: its rounds replay from their seed,
it reads how long Connect's start-up read of its offsets topic took from Connect's log, it
finds the transactional ids in kafka-transactions.sh's listing, its summary counts a round
that never recovered as a failure, and its extra loggers keep the stack's own lines."""

from __future__ import annotations

from pathlib import Path

import pytest
import typer

from chaos.cdc_recovery import (
    FaultKind,
    PlannedRound,
    RoundResult,
    debug_log4j2,
    offsets_reads,
    override,
    plan_rounds,
    properties,
    summary_lines,
    transactional_ids,
)


def test_rounds_replay_from_their_seed_and_alternate_with_pauses() -> None:
    rounds = plan_rounds(6, pauses=True, seed=7)
    assert rounds == plan_rounds(6, pauses=True, seed=7)
    assert rounds != plan_rounds(6, pauses=True, seed=8)
    assert [r.kind for r in rounds] == [FaultKind.KILL, FaultKind.PAUSE] * 3
    assert [r.number for r in rounds] == [1, 2, 3, 4, 5, 6]
    assert all(20 <= r.hold_seconds <= 40 for r in rounds if r.kind is FaultKind.PAUSE)
    assert all(1 <= r.hold_seconds <= 5 for r in rounds if r.kind is FaultKind.KILL)
    assert all(3 <= r.settle_seconds <= 8 for r in rounds)
    assert {r.kind for r in plan_rounds(4, pauses=False, seed=7)} == {FaultKind.KILL}
    fixed = plan_rounds(4, pauses=True, seed=7, down=55.0)
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
    assert "recovery (all, probe on Kafka after both back): p50 8.0 s, max 130.0 s; 1 never" in (
        lines
    )
    assert "recovery (kill, probe on Kafka after both back): p50 69.0 s, max 130.0 s" in lines
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
