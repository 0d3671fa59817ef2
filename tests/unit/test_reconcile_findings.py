"""The comparison core of ``outbox reconcile``, on hand-made evidence (no service)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from outbox_reconcile.evidence import Evidence
from outbox_reconcile.findings import Report, compare
from outbox_reconcile.metrics import ReconcileMetrics
from outbox_reconcile.records import (
    KafkaCopy,
    Malformed,
    Window,
    copy_of,
    event_time_ms,
    parse_moment,
)

TOPIC = "outbox.event.order"
TYPED = "aggregate_order"


def uuid7(ms: int, n: int) -> str:
    return str(uuid.UUID(int=(ms << 80) | (0x7 << 76) | (0b10 << 62) | n))


IDS = [uuid7(1_700_000_000_000 + i, i) for i in range(10)]


def kafka(index: int, offset: int, position: int | None, aggregate: str = "1") -> KafkaCopy:
    return KafkaCopy(IDS[index], "order", aggregate, position, TOPIC, 0, offset, 0)


def lake_row(index: int, offset: int, position: int | None, aggregate: str = "1") -> tuple:
    return (IDS[index], "order", aggregate, position, TOPIC, 0, offset, TYPED)


def healthy(evidence: Evidence, count: int = 5) -> None:
    """``count`` events of one aggregate on Kafka, in the lake and its typed table."""
    evidence.add_kafka([kafka(i, i, i + 1) for i in range(count)])
    evidence.set_kafka_range(TOPIC, 0, 0, count)
    evidence.add_lake([lake_row(i, i, i + 1) for i in range(count)])
    evidence.set_lake_progress(TOPIC, 0, count)
    evidence.add_typed("order", TYPED, IDS[:count])


def kinds(report: Report) -> dict[str, int]:
    return {finding.kind: finding.count for finding in report.findings}


def test_a_healthy_pipeline_has_no_finding() -> None:
    evidence = Evidence()
    healthy(evidence)
    evidence.add_kafka([kafka(2, 5, 3)])  # a duplicate copy on Kafka is allowed
    report = compare(evidence)
    assert report.findings == []
    assert report.exit_code == 0
    assert report.figures["kafka_events"] == 5
    assert report.figures["kafka_duplicate_copies"] == 1
    assert report.figures["lake_events"] == 5


def test_copies_of_one_id_with_other_content_are_a_finding_not_duplicates() -> None:
    """An id reused or forged: its copies are never counted as harmless duplicates."""
    evidence = Evidence()
    healthy(evidence)
    same = copy_of(
        topic=TOPIC,
        partition=0,
        offset=7,
        timestamp_ms=0,
        key=b"1",
        headers=[("id", IDS[1].encode()), ("position", b"2")],
        value=b'{"total": 10}',
    )
    assert isinstance(same, KafkaCopy) and same.digest is not None
    again = copy_of(
        topic=TOPIC,
        partition=0,
        offset=8,
        timestamp_ms=0,
        key=b"1",
        headers=[("id", IDS[1].encode()), ("position", b"2")],
        value=b'{"total": 10}',
    )
    forged = copy_of(
        topic="outbox.event.other",
        partition=0,
        offset=0,
        timestamp_ms=0,
        key=b"1",
        headers=[("id", IDS[1].encode()), ("position", b"2")],
        value=b'{"total": 0}',
    )
    evidence.add_kafka([same, again])
    report = compare(evidence)
    assert report.findings == [] and report.figures["kafka_duplicate_copies"] == 1
    evidence = Evidence()
    healthy(evidence)
    evidence.add_kafka([same, again, forged])
    report = compare(evidence)
    assert kinds(report) == {"conflicting_copies": 1}
    (example,) = report.findings[0].examples
    assert example["event_id"] == IDS[1] and example["contents"] == 2
    assert "outbox.event.other[0]@0" in example["read_at"]


def test_an_event_deleted_from_the_lake_is_missing_but_one_not_yet_ingested_is_pending() -> None:
    evidence = Evidence()
    evidence.add_kafka([kafka(i, i, i + 1) for i in range(6)])
    evidence.set_kafka_range(TOPIC, 0, 0, 6)
    evidence.add_lake([lake_row(i, i, i + 1) for i in (0, 1, 3)])
    evidence.add_typed("order", TYPED, [IDS[i] for i in (0, 1, 3)])
    evidence.set_lake_progress(TOPIC, 0, 4)  # 4 and 5: not taken in yet
    report = compare(evidence)
    assert kinds(report) == {"missing_in_lake": 1}
    assert report.findings[0].examples[0]["event_id"] == IDS[2]
    assert report.figures["lake_pending_ingest"] == 2
    assert report.exit_code == 1


def test_a_record_quarantined_by_the_lake_is_not_missing_but_quarantined() -> None:
    evidence = Evidence()
    healthy(evidence, 3)
    evidence.add_kafka([kafka(3, 3, 4)])
    evidence.set_kafka_range(TOPIC, 0, 0, 4)
    evidence.set_lake_progress(TOPIC, 0, 4)
    evidence.add_quarantine([("order", "events", TOPIC, 0, 3, None, "not JSON", True)])
    report = compare(evidence)
    assert kinds(report) == {"quarantined": 1}
    assert report.findings[0].examples == [
        {"target_table": "events", "reason": "not JSON", "rows": 1}
    ]


def test_duplicates_in_events_and_typed_tables_are_found() -> None:
    evidence = Evidence()
    healthy(evidence)
    evidence.add_lake([lake_row(1, 1, 2)])
    evidence.add_typed("order", TYPED, [IDS[4]])
    report = compare(evidence)
    assert kinds(report) == {"duplicate_in_lake": 1, "duplicate_in_typed_table": 1}


def test_a_lake_row_never_on_kafka_is_found_unless_outside_the_range_read() -> None:
    evidence = Evidence()
    healthy(evidence)
    evidence.add_lake([lake_row(7, 2, 99), lake_row(8, 9, 100)])  # 9: beyond the read
    evidence.add_typed("order", TYPED, IDS[7:9])
    report = compare(evidence)
    found = {finding.kind: finding for finding in report.findings}
    # Offset 2 holds another event on Kafka: the phantom also breaks the lake's order.
    assert set(found) == {"not_on_kafka", "lake_order_violation"}
    assert [example["event_id"] for example in found["not_on_kafka"].examples] == [IDS[7]]
    assert report.figures["lake_rows_beyond_kafka_read"] == 1


def test_order_is_judged_per_aggregate_on_first_copies() -> None:
    evidence = Evidence()
    evidence.add_kafka(
        [
            kafka(0, 0, 1, "a"),
            kafka(1, 1, 5, "b"),  # another aggregate: never compared with "a"
            kafka(2, 2, 3, "a"),
            kafka(0, 3, 1, "a"),  # a duplicate of an earlier event: allowed
            kafka(3, 4, 2, "a"),  # lower than 3, after it: a violation
        ]
    )
    evidence.set_kafka_range(TOPIC, 0, 0, 5)
    report = compare(evidence)
    assert kinds(report) == {"kafka_order_violation": 1}
    assert report.findings[0].examples[0]["event_id"] == IDS[3]
    assert report.findings[0].examples[0]["after_position"] == 3


def test_positions_that_differ_between_kafka_and_the_lake_are_found() -> None:
    evidence = Evidence()
    healthy(evidence, 2)
    evidence.db.execute("UPDATE lake SET position = 7 WHERE event_id = ?", (IDS[0],))
    report = compare(evidence)
    assert "position_mismatch" in kinds(report)


def test_a_typed_row_missing_is_found_unless_quarantined_for_that_table() -> None:
    evidence = Evidence()
    evidence.add_kafka([kafka(i, i, i + 1) for i in range(3)])
    evidence.set_kafka_range(TOPIC, 0, 0, 3)
    evidence.add_lake([lake_row(i, i, i + 1) for i in range(3)])
    evidence.set_lake_progress(TOPIC, 0, 3)
    evidence.add_typed("order", TYPED, [IDS[0]])
    evidence.add_quarantine([("order", TYPED, TOPIC, 0, 1, IDS[1], "int64 overflow", True)])
    report = compare(evidence)
    assert kinds(report) == {"typed_row_missing": 1, "quarantined": 1}
    missing = next(f for f in report.findings if f.kind == "typed_row_missing")
    assert missing.examples[0]["event_id"] == IDS[2]


def test_stuck_rows_and_dead_letters_are_findings_rows_in_flight_are_not() -> None:
    evidence = Evidence()
    healthy(evidence, 2)
    evidence.add_outbox_rows(
        [
            (IDS[0], "order", "1", 1, 500.0),  # on Kafka: delivered, not deleted yet
            (IDS[5], "order", "1", 6, 500.0),  # stuck
            (IDS[6], "order", "1", 7, 1.0),  # in flight
        ]
    )
    evidence.add_dead_letters([(IDS[7], "order", "2", 8, "too large", "2026-11-23")])
    report = compare(evidence, stuck_after_seconds=60)
    assert kinds(report) == {"outbox_stuck": 1, "dead_letter": 1}
    assert report.figures["outbox_rows_in_flight"] == 1
    assert report.figures["outbox_rows_delivered_not_deleted"] == 1
    assert report.by_aggregate_type() == {"order": {"dead_letter": 1, "outbox_stuck": 1}}


def test_examples_are_bounded_and_counts_are_not() -> None:
    evidence = Evidence()
    evidence.add_dead_letters([(IDS[i], "order", "1", i, "x", "t") for i in range(10)])
    report = compare(evidence, examples=3)
    assert report.findings[0].count == 10
    assert len(report.findings[0].examples) == 3


def test_a_record_without_an_id_is_malformed_and_the_rest_is_read_from_headers() -> None:
    record = copy_of(
        topic=TOPIC,
        partition=1,
        offset=9,
        timestamp_ms=5,
        key=b"42",
        headers=[("id", IDS[0].encode()), ("position", b"17")],
    )
    assert record == KafkaCopy(IDS[0], "order", "42", 17, TOPIC, 1, 9, 5)
    missing = copy_of(topic=TOPIC, partition=0, offset=0, timestamp_ms=0, key=None, headers=[])
    assert isinstance(missing, Malformed)
    bad = copy_of(
        topic=TOPIC, partition=0, offset=0, timestamp_ms=0, key=None, headers=[("id", b"\xff")]
    )
    assert isinstance(bad, Malformed)
    unpositioned = copy_of(
        topic=TOPIC,
        partition=0,
        offset=0,
        timestamp_ms=0,
        key=None,
        headers=[("id", IDS[0].encode()), ("position", b"-1")],
    )
    assert isinstance(unpositioned, KafkaCopy) and unpositioned.position is None


def test_the_window_uses_the_time_in_the_event_id() -> None:
    assert event_time_ms(IDS[3]) == 1_700_000_000_003
    assert event_time_ms(str(uuid.uuid4())) == 0
    start = datetime.fromtimestamp(1_700_000_000.002, tz=UTC)
    window = Window(since=start, until=start + timedelta(milliseconds=2))
    assert [window.holds(event_id) for event_id in IDS[:5]] == [False, False, True, True, False]
    assert Window().holds(IDS[0])
    with pytest.raises(ValueError, match="before"):
        Window(since=start, until=start)


def test_moments_are_iso_or_a_duration_ago() -> None:
    now = datetime(2026, 11, 23, 12, tzinfo=UTC)
    assert parse_moment("90m", now=now) == now - timedelta(minutes=90)
    assert parse_moment("7d", now=now) == now - timedelta(days=7)
    assert parse_moment("2026-11-23T10:00:00") == datetime(2026, 11, 23, 10, tzinfo=UTC)
    with pytest.raises(ValueError, match="ISO 8601"):
        parse_moment("yesterday")


def test_the_metrics_file_carries_each_finding_and_zero_for_the_others(tmp_path: Path) -> None:
    evidence = Evidence()
    evidence.add_dead_letters([(IDS[0], "order", "1", 1, "x", "t")])
    report = compare(evidence)
    report.slots = {"outbox_slot": 4096}
    metrics = ReconcileMetrics()
    metrics.record(report)
    target = tmp_path / "outbox_reconcile.prom"
    metrics.write(str(target))
    text = target.read_text()
    assert 'outbox_reconcile_findings{aggregate_type="order",kind="dead_letter"} 1.0' in text
    assert 'outbox_reconcile_findings{aggregate_type="",kind="missing_in_lake"} 0.0' in text
    assert 'outbox_reconcile_slot_retained_wal_bytes{slot="outbox_slot"} 4096.0' in text
    assert "outbox_reconcile_last_run_timestamp_seconds" in text
