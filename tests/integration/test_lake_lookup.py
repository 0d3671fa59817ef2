"""The driver's lookup of what landed (``rows_within``), on a real Delta table written with
``deltalake``: a catch-up's files each hold ids of the whole backlog, so their statistics
narrow nothing; the lookup of a batch's own ids must still bring only those rows back."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from outbox import new_event_id
from outbox_lake.delta_writes import create_table, ranges_of, rows_within
from outbox_lake.settings import LakeSettings
from outbox_lake.tables import EVENTS_TABLE

pytestmark = pytest.mark.timeout(120)


def _files_over_the_whole_backlog(uri: str, ids: list[str]) -> None:
    """Four files, file k holding ids k, k+4, k+8...: each spans (almost) every id."""
    schema = EVENTS_TABLE.arrow_schema()
    now = datetime.now(UTC)
    for k in range(4):
        mine = ids[k::4]
        columns = {field.name: pa.nulls(len(mine), field.type) for field in schema}
        columns["event_id"] = pa.array(mine, pa.string())
        columns["payload"] = pa.array([f'{{"id": "{i}"}}' for i in mine], pa.string())
        columns["event_date"] = pa.array([now.date()] * len(mine), pa.date32())
        columns["event_time"] = pa.array([now] * len(mine), schema.field("event_time").type)
        write_deltalake(uri, pa.table(columns, schema=schema), mode="append")


def test_a_lookup_of_a_batch_s_ids_returns_those_rows_alone(tmp_path: Path) -> None:
    settings = LakeSettings(root=str(tmp_path))
    uri = str(tmp_path / "events")
    create_table(settings, uri, EVENTS_TABLE.arrow_schema(), by_day=True, owner=None)
    ids = sorted(str(new_event_id()) for _ in range(400))
    _files_over_the_whole_backlog(uri, ids)
    table = DeltaTable(uri)
    day = [datetime.now(UTC).date()] * len(ids)
    ranges = ranges_of(ids, day)  # one range: every file may hold any id of it

    batch = [ids[3], ids[200], "0000-not-landed"]
    found = rows_within(settings, table, uri, ranges, ["event_id", "payload"], batch)
    assert sorted(found.column("event_id").to_pylist()) == sorted([ids[3], ids[200]])
    assert found.column_names == ["event_id", "payload"]
    assert sorted(found.column("payload").to_pylist()) == sorted(
        f'{{"id": "{i}"}}' for i in (ids[3], ids[200])
    )

    only_ids = rows_within(settings, table, uri, ranges, ["event_id"], set(batch))
    assert only_ids.column_names == ["event_id"]
    assert sorted(only_ids.column("event_id").to_pylist()) == sorted([ids[3], ids[200]])

    assert rows_within(settings, table, uri, ranges, ["event_id"], ["none-of-them"]).num_rows == 0
    assert rows_within(settings, table, uri, ranges, ["event_id", "payload"], []).num_rows == 0
    everything = rows_within(settings, table, uri, ranges, ["event_id"])
    assert sorted(everything.column("event_id").to_pylist()) == ids
