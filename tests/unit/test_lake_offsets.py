"""The lake's data-loss decisions over typed offsets (pure: the broker's answers are given)."""

from __future__ import annotations

from pathlib import Path

from outbox_lake.offsets import (
    EARLIEST,
    BrokerPartition,
    Partition,
    Progress,
    fingerprint,
    loss_message,
    losses,
    replaced_topics,
    starting_offsets,
)
from outbox_lake.tables import EVENTS_TABLE, QUARANTINE_TABLE, TYPED_BASE, docs_table

A0, A1, B0 = Partition("ta", 0), Partition("ta", 1), Partition("tb", 0)
ROOT = Path(__file__).resolve().parents[2]


def test_a_partition_read_to_its_end_has_lost_nothing() -> None:
    progress = {A0: Progress(10, "id-a", "1-aa")}
    assert losses(progress, {A0: BrokerPartition(0, 10, "id-a")}, {A0: "1-aa"}) == []
    assert losses(progress, {A0: BrokerPartition(10, 25, "id-a")}, {}) == []
    # A topic that is gone (deleted, not recreated): nothing more to read, no loss.
    assert losses(progress, {}) == []


def test_records_deleted_by_retention_before_they_were_read_are_counted() -> None:
    (loss,) = losses({A0: Progress(10, "id-a")}, {A0: BrokerPartition(25, 40, "id-a")})
    assert loss.kind == "retention" and loss.skipped == 15
    assert "offsets 10 to 24 were deleted by retention" in loss.what
    assert "ta[0]: offsets 10 to 24" in loss_message(loss)
    assert "OUTBOX_LAKE_FAIL_ON_DATA_LOSS=false" in loss_message(loss)


def test_a_recreated_topic_is_told_by_its_id_even_when_refilled_past_the_lake() -> None:
    (loss,) = losses({A0: Progress(10, "old")}, {A0: BrokerPartition(0, 15, "new")})
    assert loss.kind == "replaced"
    assert loss_message(loss).startswith("ta: the topic on the broker is not the one")
    assert replaced_topics([loss]) == {"ta"}


def test_without_ids_a_shorter_log_and_another_record_are_data_loss() -> None:
    shorter = losses({A0: Progress(10, None, "5-aa")}, {A0: BrokerPartition(0, 3, None)})
    assert [loss.kind for loss in shorter] == ["truncated"]
    refilled = losses(
        {A0: Progress(10, None, "5-aa")}, {A0: BrokerPartition(0, 15, None)}, {A0: "7-bb"}
    )
    assert [loss.kind for loss in refilled] == ["another_log"]
    assert "the record at offset 9 is not the one" in refilled[0].what
    # The record gone altogether (compacted, or another log without it): another log too.
    gone = losses({A0: Progress(10, None, "5-aa")}, {A0: BrokerPartition(0, 15, None)}, {A0: None})
    assert [loss.kind for loss in gone] == ["another_log"]
    # No fingerprint known (a lake of an earlier release): nothing to compare.
    assert losses({A0: Progress(10)}, {A0: BrokerPartition(0, 15, None)}, {A0: "7-bb"}) == []


def test_a_query_without_checkpoint_starts_where_the_lake_stands() -> None:
    broker = {
        A0: BrokerPartition(0, 50, "a"),
        A1: BrokerPartition(30, 50, "a"),
        B0: BrokerPartition(0, 5, "b"),
    }
    progress = {A0: Progress(20, "a"), A1: Progress(10, "a"), B0: Progress(9, "b")}
    assert starting_offsets(progress, broker) == {"ta": {"0": 20, "1": 30}, "tb": {"0": 5}}
    assert starting_offsets({}, broker) == {
        "ta": {"0": EARLIEST, "1": EARLIEST},
        "tb": {"0": EARLIEST},
    }
    assert starting_offsets(progress, broker, {"ta"})["ta"] == {"0": EARLIEST, "1": EARLIEST}


def test_a_fingerprint_tells_content_and_time_apart() -> None:
    one = fingerprint(1000, b"k", b"v", [("id", b"1")])
    assert one == fingerprint(1000, b"k", b"v", [("id", b"1")])
    assert one != fingerprint(1001, b"k", b"v", [("id", b"1")])
    assert one != fingerprint(1000, b"k", b"w", [("id", b"1")])
    assert one != fingerprint(1000, b"k", b"v", [("id", b"2")])
    assert fingerprint(0, None, None, [("\ufffd", None)])  # whatever a record holds


def test_each_table_is_defined_once_and_the_docs_show_it() -> None:
    arrow = EVENTS_TABLE.arrow_schema()
    assert arrow.names == EVENTS_TABLE.names
    assert str(arrow.field("event_time").type) == "timestamp[us, tz=UTC]"
    assert "`partition` int" in EVENTS_TABLE.spark_ddl()
    assert QUARANTINE_TABLE.key == "quarantine_id" and not QUARANTINE_TABLE.by_day
    assert [c.name for c in TYPED_BASE][:2] == ["event_id", "aggregate_type"]
    assert docs_table() in (ROOT / "docs" / "analysts.md").read_text()
