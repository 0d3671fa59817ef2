"""The typed query's writes (:class:`outbox_lake.typed.TypedSink`): an aggregate type's rows
land in one Spark job in the common case; a batch read again (a crash after the typed
commit, before the checkpoint's; a deleted checkpoint) adds nothing; a row the table cannot
take yet takes the two-job path; an abandoned one-job attempt leaves no file behind.
(Spark and Delta in this process, no service: the sink is given frames as the typed
query's ``foreachBatch`` gives them, in the ``events`` table's columns.)"""

from __future__ import annotations

import json
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from deltalake import DeltaTable

from outbox import new_event_id
from tests.fix_lake import shared_spark

EVENTS_SCHEMA = (
    "event_id string, aggregate_type string, aggregate_id string, event_type string, "
    "payload string, position long, event_time timestamp, event_date date, topic string, "
    "partition int, offset long"
)


def _rows(aggregate_type: str, payloads: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    now = datetime.now(UTC)
    topic = f"outbox.event.{aggregate_type}"
    return [
        (
            str(new_event_id()),
            aggregate_type,
            str(n),
            "E",
            json.dumps(p),
            n,
            now,
            date.today(),
            topic,
            0,
            n,
        )
        for n, p in enumerate(payloads)
    ]


def _table(root: Path, aggregate_type: str) -> DeltaTable:
    return DeltaTable(str(root / f"aggregate_{aggregate_type}"))


def _data_files(root: Path, aggregate_type: str) -> set[str]:
    folder = root / f"aggregate_{aggregate_type}"
    return {
        str(p.relative_to(folder)) for p in folder.rglob("*.parquet") if "_delta_log" not in p.parts
    }


def _named(table: DeltaTable) -> set[str]:
    """The data files the table's log names."""
    import pyarrow as pa

    paths = pa.table(table.get_add_actions(flatten=True)).column("path").to_pylist()
    return {unquote(path) for path in paths}


def test_typed_rows_land_in_one_job_and_a_batch_read_again_adds_nothing(tmp_path: Path) -> None:
    from outbox_cli.lake import with_spark_jars
    from outbox_lake.metrics import LakeMetrics
    from outbox_lake.settings import LakeSettings
    from outbox_lake.typed import TypedSink

    spark = shared_spark()
    root = tmp_path / "lake"
    settings = with_spark_jars(LakeSettings(root=str(root)))
    metrics = LakeMetrics()
    sink = TypedSink(settings, metrics, one_task=True)
    rows = _rows("order", [{"n": n, "who": f"c{n}"} for n in range(40)])

    def written(path: str) -> float:
        return metrics.typed_writes.labels(path)._value.get()

    def batch(part: list[tuple[Any, ...]], batch_id: int) -> None:
        sink(spark.createDataFrame(part, EVENTS_SCHEMA), batch_id)

    batch(rows[:10], 0)  # a new table: two jobs (its columns decided from the rows)
    assert (written("one_job"), written("two_jobs")) == (0, 1)
    batch(rows[10:30], 1)  # the common batch
    assert (written("one_job"), written("two_jobs")) == (1, 1)
    table = _table(root, "order")
    ids = table.to_pyarrow_table(columns=["event_id"]).column(0).to_pylist()
    assert sorted(ids) == sorted(row[0] for row in rows[:30])
    assert _data_files(root, "order") == _named(table)

    batch(rows[10:30], 1)  # read again: the one-job attempt finds its copies landed
    batch(rows[25:40], 2)  # half read again, half new
    assert (written("one_job"), written("two_jobs")) == (1, 3)
    table = _table(root, "order")
    ids = table.to_pyarrow_table(columns=["event_id"]).column(0).to_pylist()
    assert len(ids) == len(set(ids)) == 40
    # the abandoned attempts' files were deleted: every data file is one the log names
    assert _data_files(root, "order") == _named(table)

    # a field the table lacks: two jobs, the column added, the rows typed
    more = _rows("order", [{"n": 40, "who": "c40", "coupon": "XMAS"}, {"n": 41, "who": "c41"}])
    batch(more, 3)
    assert written("two_jobs") == 4
    batch(_rows("order", [{"n": 42, "who": "c42", "coupon": None}]), 4)
    assert written("one_job") == 2
    typed = _table(root, "order").to_pyarrow_table().to_pylist()
    assert len(typed) == len({row["event_id"] for row in typed}) == 43
    assert [row["coupon"] for row in typed if row["n"] == 40] == ["XMAS"]
    assert _data_files(root, "order") == _named(_table(root, "order"))

    # a batch of another type only: the guess (the type before) writes nothing and sees it
    refunds = _rows("refund", [{"n": n} for n in range(3)])
    batch(refunds, 5)
    assert len(_table(root, "refund").to_pyarrow_table()) == 3
    assert len(_table(root, "order").to_pyarrow_table()) == 43
    assert _data_files(root, "order") == _named(_table(root, "order"))


def test_each_aggregate_type_of_a_batch_takes_its_own_path(tmp_path: Path) -> None:
    """Two types in one batch: the one whose rows fit lands in one job, the one with a row
    set aside (a string where the table has a number) takes two, its row in quarantine."""
    from outbox_cli.lake import with_spark_jars
    from outbox_lake.delta_writes import create_table
    from outbox_lake.metrics import LakeMetrics
    from outbox_lake.settings import LakeSettings
    from outbox_lake.tables import QUARANTINE_TABLE
    from outbox_lake.typed import TypedSink

    spark = shared_spark()
    root = tmp_path / "lake"
    settings = with_spark_jars(LakeSettings(root=str(root)))
    create_table(
        settings,
        settings.table_uri(QUARANTINE_TABLE.name),
        QUARANTINE_TABLE.arrow_schema(),
        by_day=QUARANTINE_TABLE.by_day,
        owner=None,
    )
    metrics = LakeMetrics()
    sink = TypedSink(settings, metrics, one_task=False)
    orders = _rows("order", [{"n": n} for n in range(6)])
    payments = _rows("payment", [{"amount": n} for n in range(6)])
    sink(spark.createDataFrame(orders[:3] + payments[:3], EVENTS_SCHEMA), 0)  # new tables
    bad = _rows("payment", [{"amount": "lots"}])
    sink(spark.createDataFrame(orders[3:] + payments[3:] + bad, EVENTS_SCHEMA), 1)
    assert metrics.typed_writes.labels("one_job")._value.get() == 1
    assert metrics.typed_writes.labels("two_jobs")._value.get() == 3
    assert len(_table(root, "order").to_pyarrow_table()) == 6
    assert len(_table(root, "payment").to_pyarrow_table()) == 6
    aside = DeltaTable(str(root / "quarantine")).to_pyarrow_table().to_pylist()
    assert [row["event_id"] for row in aside] == [bad[0][0]]
    assert "amount" in aside[0]["reason"]


def test_a_batch_of_many_types_lands_each_once_from_memory(tmp_path: Path) -> None:
    """More types than CACHED_TYPES in a batch: the batch is kept in memory while each
    type's rows are written (first batch: the tables are new; second: one job each; third:
    read again, nothing added), and every type's rows land once."""
    from outbox_cli.lake import with_spark_jars
    from outbox_lake.metrics import LakeMetrics
    from outbox_lake.settings import LakeSettings
    from outbox_lake.typed import CACHED_TYPES, TypedSink

    spark = shared_spark()
    root = tmp_path / "lake"
    settings = with_spark_jars(LakeSettings(root=str(root)))
    metrics = LakeMetrics()
    sink = TypedSink(settings, metrics, one_task=True)
    cached_before = spark.sparkContext._jsc.getPersistentRDDs().size()
    types = [f"t{n}" for n in range(CACHED_TYPES + 2)]
    rows = {t: _rows(t, [{"n": n, "of": t} for n in range(8)]) for t in types}
    first = [row for t in types for row in rows[t][:4]]
    second = [row for t in types for row in rows[t][4:]]
    sink(spark.createDataFrame(first, EVENTS_SCHEMA), 0)
    sink(spark.createDataFrame(second, EVENTS_SCHEMA), 1)
    assert metrics.typed_writes.labels("one_job")._value.get() == len(types)
    sink(spark.createDataFrame(second, EVENTS_SCHEMA), 1)  # read again
    for t in types:
        landed = _table(root, t).to_pyarrow_table(columns=["event_id", "of"]).to_pylist()
        assert sorted(row["event_id"] for row in landed) == sorted(row[0] for row in rows[t])
        assert {row["of"] for row in landed} == {t}
    assert spark.sparkContext._jsc.getPersistentRDDs().size() == cached_before  # none left


def test_maintain_vacuums_files_no_commit_names_once_they_are_an_hour_old(
    tmp_path: Path,
) -> None:
    """A job killed between a batch's write and its commit leaves files that no commit
    names; ``outbox lake maintain`` removes them, but beside a running job never one that
    may be a write about to be committed."""
    import os
    import time

    import pyarrow as pa
    from deltalake import write_deltalake

    from outbox_lake.maintenance import maintain
    from outbox_lake.settings import LakeSettings

    root = tmp_path / "lake"
    table = root / "aggregate_order"
    write_deltalake(str(table), pa.table({"event_id": ["a", "b"], "n": [1, 2]}))
    orphan_old, orphan_new = table / "part-old-orphan.parquet", table / "part-new-orphan.parquet"
    for orphan in (orphan_old, orphan_new):
        orphan.write_bytes((table / _named(DeltaTable(str(table))).pop()).read_bytes())
    two_hours_ago = time.time() - 7200
    os.utime(orphan_old, (two_hours_ago, two_hours_ago))

    maintain(LakeSettings(root=str(root)), retention_hours=0)
    assert not orphan_old.exists() and orphan_new.exists()
    assert len(DeltaTable(str(table)).to_pyarrow_table()) == 2
