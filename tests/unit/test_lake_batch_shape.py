"""The one-job path's shape of a batch, from what the write observed (pure)."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pyarrow as pa

from outbox_lake.delta_writes import IdRange
from outbox_lake.landing import BatchShape, _ids_shape, _observed_shape
from outbox_lake.offsets import Partition


def _task(task: int, topic: str | None, partition: int | None, **values: Any) -> dict[str, Any]:
    return {
        f"topic_low_{task}": topic,
        f"topic_high_{task}": values.get("topic_high", topic),
        f"partition_low_{task}": partition,
        f"partition_high_{task}": values.get("partition_high", partition),
        f"first_{task}": values.get("first"),
        f"last_{task}": values.get("last"),
        f"fingerprint_{task}": values.get("fingerprint"),
        f"records_{task}": values.get("records", 0),
    }


def test_each_task_s_partition_gives_its_offsets_and_last_record() -> None:
    metrics = {
        "undecided": 0,
        **_task(0, "outbox.event.a", 1, first=10, last=19, fingerprint="f1", records=10),
        **_task(1, None, None),  # a task that read nothing
        **_task(2, "outbox.event.b", 0, first=0, last=4, fingerprint="f2", records=3),
    }
    shape = _observed_shape(metrics, 3)
    assert shape is not None
    assert shape.ends == {
        Partition("outbox.event.a", 1): (20, "f1"),
        Partition("outbox.event.b", 0): (5, "f2"),
    }
    assert shape.starts == {Partition("outbox.event.a", 1): 10, Partition("outbox.event.b", 0): 0}
    assert shape.records == 13 and shape.undecided == 0


def test_a_task_of_two_partitions_or_a_partition_of_two_tasks_is_left_to_two_jobs() -> None:
    mixed = _task(0, "outbox.event.a", 0, partition_high=1, first=0, last=9, records=4)
    assert _observed_shape({"undecided": 0, **mixed}, 1) is None
    topics = _task(0, "outbox.event.a", 0, topic_high="outbox.event.b", first=0, last=9, records=4)
    assert _observed_shape({"undecided": 0, **topics}, 1) is None
    split = {
        "undecided": 0,
        **_task(0, "outbox.event.a", 0, first=0, last=4, fingerprint="x", records=5),
        **_task(1, "outbox.event.a", 0, first=5, last=9, fingerprint="y", records=5),
    }
    assert _observed_shape(split, 2) is None


def test_undecided_records_are_counted() -> None:
    metrics = {"undecided": 2, **_task(0, "t", 0, first=0, last=2, records=3)}
    shape = _observed_shape(metrics, 1)
    assert shape is not None and shape.undecided == 2


def test_the_written_ids_give_ranges_repeats_and_the_newest_time() -> None:
    day = "2026-11-29"
    ids = [
        "019ace00-0000-7000-8000-000000000002",
        "019ace00-0000-7000-8000-000000000001",
        "019acf11-0000-7000-8000-000000000001",
        "019ace00-0000-7000-8000-000000000001",
    ]
    times = [dt.datetime(2026, 11, 29, 1, 2, second) for second in (3, 1, 9, 1)]
    written = pa.table(
        {
            "event_id": ids,
            "event_date": [day] * 4,
            "event_time": pa.array(times, pa.timestamp("us")),
        }
    )
    shape = BatchShape()
    unique = _ids_shape(shape, written)
    assert unique == set(ids)
    assert shape.events == 4 and shape.repeated == 1
    the_day = dt.date(2026, 11, 29)
    assert shape.ranges == [
        IdRange(the_day, ids[1], ids[0]),
        IdRange(the_day, ids[2], ids[2]),
    ]
    assert shape.newest_event_time == dt.datetime(2026, 11, 29, 1, 2, 9, tzinfo=dt.UTC).timestamp()


def test_nothing_written_is_no_event() -> None:
    shape = BatchShape()
    assert _ids_shape(shape, None) == set() and shape.events == 0
