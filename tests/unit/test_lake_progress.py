"""The lake's progress and the decisions around it (pure: no Spark, no broker)."""

from __future__ import annotations

from datetime import date

from outbox_lake.delta_writes import IdRange, id_ranges
from outbox_lake.guard import Refuse, StartOver, verdict
from outbox_lake.offsets import BrokerPartition, Partition, Progress, losses
from outbox_lake.progress import LakeProgress, advanced

A0, A1, B0 = Partition("ta", 0), Partition("ta", 1), Partition("tb", 0)


def test_progress_travels_in_a_commit_s_metadata_and_back() -> None:
    progress = LakeProgress({A0: Progress(10, "id-a", "1-aa"), B0: Progress(3)}, 41)
    assert LakeProgress.from_metadata(progress.to_metadata()) == progress
    # Metadata that is not ours, or broken, is no progress.
    assert LakeProgress.from_metadata(None) is None
    assert LakeProgress.from_metadata('{"someone": "else"}') is None
    assert LakeProgress.from_metadata('{"outbox_lake_progress": 1, "partitions": [[1]]}') is None


def test_an_offset_never_moves_back_for_the_same_log() -> None:
    known = {A0: Progress(10, "id-a", "1-aa")}
    assert advanced(known, {A0: (7, "2-bb")}, {"ta": "id-a"}) == known  # a replay
    assert advanced(known, {A0: (12, "3-cc")}, {"ta": "id-a"}) == {A0: Progress(12, "id-a", "3-cc")}
    # Another log (the topic's id changed): its offsets, whatever they are.
    assert advanced(known, {A0: (2, "4-dd")}, {"ta": "id-b"}) == {A0: Progress(2, "id-b", "4-dd")}


def test_an_id_learned_later_is_kept_and_other_partitions_are_left_alone() -> None:
    known = {A0: Progress(10, None, "1-aa"), B0: Progress(5, "id-b")}
    after = advanced(known, {A0: (10, "1-aa")}, {"ta": "id-a"})
    assert after == {A0: Progress(10, "id-a", "1-aa"), B0: Progress(5, "id-b")}


def test_a_topic_started_over_loses_its_old_progress_in_the_same_commit() -> None:
    known = {A0: Progress(10, "old"), A1: Progress(8, "old"), B0: Progress(5, "id-b")}
    after = advanced(known, {A0: (3, "5-ee")}, {"ta": "new"}, started_over=frozenset({"ta"}))
    assert after == {A0: Progress(3, "new", "5-ee"), B0: Progress(5, "id-b")}


def test_the_guard_refuses_or_starts_replaced_topics_over_but_never_for_retention() -> None:
    replaced = losses({A0: Progress(10, "old")}, {A0: BrokerPartition(0, 3, "new")})
    retention = losses({B0: Progress(10, "id-b")}, {B0: BrokerPartition(20, 30, "id-b")})
    assert verdict([], fail_on_data_loss=True) is None
    assert isinstance(verdict(replaced + retention, fail_on_data_loss=True), Refuse)
    assert verdict(replaced + retention, fail_on_data_loss=False) == StartOver(frozenset({"ta"}))
    assert verdict(retention, fail_on_data_loss=False) is None  # Spark's source skips, logged


def test_id_ranges_are_merged_per_day_and_bounded_in_number() -> None:
    day, other = date(2026, 11, 28), date(2026, 11, 29)
    found = [
        IdRange(day, "019a0000-0000", "019a0000-0fff"),
        IdRange(day, "019a0000-0800", "019a0001-0000"),  # overlaps the first
        IdRange(other, "019a0000-0900", "019a0000-0a00"),  # another day: never merged
        IdRange(day, "019b0000-0000", "019b0000-0001"),
    ]
    assert id_ranges(found) == [
        IdRange(day, "019a0000-0000", "019a0001-0000"),
        IdRange(day, "019b0000-0000", "019b0000-0001"),
        IdRange(other, "019a0000-0900", "019a0000-0a00"),
    ]
    many = [IdRange(day, f"{n:08x}-a", f"{n:08x}-b") for n in range(0, 200, 2)]
    bounded = id_ranges(many, limit=10)
    assert len(bounded) == 10
    for item in many:  # every id of every range is still inside one
        assert any(r.low <= item.low and item.high <= r.high for r in bounded)
