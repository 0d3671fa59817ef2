"""`outbox lake tables`' freshness line: what it says of a lake behind Kafka. (Pure.)"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from outbox_cli.lake import freshness_line
from outbox_lake.query import Freshness, _lag

NOW = datetime(2026, 11, 28, 12, 0, tzinfo=UTC)


def test_a_lake_that_keeps_up_says_so() -> None:
    found = Freshness(NOW - timedelta(seconds=2), NOW - timedelta(seconds=3), 0)
    assert freshness_line(found, NOW) == (
        "freshness: last commit 2 s ago, newest event 3 s ago; up to date with Kafka"
    )


def test_a_lake_no_job_feeds_says_what_to_check() -> None:
    found = Freshness(NOW - timedelta(hours=1), NOW - timedelta(hours=1), 74_968, 2)
    line = freshness_line(found, NOW)
    assert "behind Kafka by 74,968 records in 2 partitions" in line
    assert "is `outbox lake ingest` running?" in line and "outbox stack status" in line
    catching_up = freshness_line(Freshness(NOW - timedelta(seconds=5), None, 900, 1), NOW)
    assert catching_up.endswith("(the ingest job is catching up)")


def test_an_unknown_lag_says_why() -> None:
    found = Freshness(None, None, None, unknown_reason="Kafka at k:1 did not answer")
    assert freshness_line(found, NOW) == (
        "freshness: last commit never, newest event never; lag behind Kafka unknown "
        "(Kafka at k:1 did not answer)"
    )


def test_a_commit_marker_is_no_lag() -> None:
    assert [_lag(n) for n in (-1, 0, 1, 2, 10)] == [0, 0, 0, 2, 10]


def test_the_ingest_summary_counts_what_the_job_did() -> None:
    from outbox_lake.metrics import LakeMetrics

    metrics = LakeMetrics()
    metrics.batches.inc(3)
    metrics.two_job_batches.inc(1)
    metrics.events.inc(75_000)
    metrics.duplicates.inc(12)
    metrics.quarantined.labels("record").inc(2)
    metrics.quarantined.labels("typed").inc(1)
    metrics.conflicting.inc(1)
    assert metrics.summary(30.0) == (
        "lake ingest: 3 batches (1 in two jobs), 75,000 events landed, 12 duplicates dropped, "
        "3 rows set "
        "aside (1 conflicting copies), in 30.0 s (2,500 events/s)"
    )


def test_a_long_catch_up_says_how_far_it_has_come() -> None:
    from outbox_lake.metrics import LakeMetrics

    metrics = LakeMetrics()
    assert metrics.progress(4.2) == "lake ingest: 0 batches, 0 events landed so far (4 s)"
    metrics.batch_done(2.0, None)
    metrics.events.inc(50_000)
    metrics.lag.labels("outbox.event.order", "0").set(20_000)
    metrics.lag.labels("outbox.event.order", "1").set(5_000)
    assert metrics.progress(31.0) == (
        "lake ingest: 1 batches, 50,000 events landed so far, 25,000 records behind on Kafka (31 s)"
    )
