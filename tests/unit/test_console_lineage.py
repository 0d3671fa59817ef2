"""The console's lineage: in two steps (the outbox and the lake at once, then Kafka
searched), and the Kafka readers it keeps for ``outbox trace``'s function. No service is
needed: trace and its readers are fakes, the pages are read through Starlette's test client."""

from __future__ import annotations

import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

import outbox_reconcile.trace as trace
from outbox.settings import KafkaSettings, OutboxSettings
from outbox_connect.settings import ConnectorSettings
from outbox_console import Console, ConsoleSettings, Guard, Pipeline, create_app
from outbox_console.lineage import Tracer
from outbox_lake.settings import LakeSettings
from outbox_reconcile.trace import Lineage

EVENT_ID = "0190c5a8-9c1e-7000-8000-000000000001"


def pipeline_for(tmp_path: Path) -> Pipeline:
    return Pipeline(
        console=ConsoleSettings(),
        database_url="postgresql+psycopg://u:p@127.0.0.1:1/x",
        outbox=OutboxSettings(),
        connector=ConnectorSettings(),
        kafka=KafkaSettings(bootstrap_servers="127.0.0.1:1"),
        lake=LakeSettings(root=str(tmp_path / "lake")),
    )


class FakeReader:
    def __init__(self) -> None:
        self.closed = False

    def close(self) -> None:
        self.closed = True


class Traces:
    """``trace_event`` and ``trace_reader`` as fakes: the readers made, the readers lent."""

    def __init__(self) -> None:
        self.made: list[FakeReader] = []
        self.lent: list[Any] = []
        self.fail = False

    def reader(self, _kafka: Any) -> FakeReader:
        self.made.append(FakeReader())
        return self.made[-1]

    def event(self, _sources: Any, event_id: str, **options: Any) -> Lineage:
        self.lent.append(options["reader"])
        if self.fail:
            raise OSError("the broker went away")
        lineage = Lineage(event_id, datetime(2026, 1, 2, tzinfo=UTC))
        if options["search_kafka"]:
            copy = {"topic": "outbox.event.order", "partition": 0, "offset": 7}
            lineage.kafka = [copy]
        return lineage


@pytest.fixture
def traces(monkeypatch: pytest.MonkeyPatch) -> Traces:
    fake = Traces()
    monkeypatch.setattr(trace, "trace_reader", fake.reader)
    monkeypatch.setattr(trace, "trace_event", fake.event)
    return fake


def test_a_reader_is_made_on_first_use_kept_and_lent_again(tmp_path: Path, traces: Traces) -> None:
    tracer = Tracer(pipeline_for(tmp_path), None)
    assert traces.made == []  # nothing opened before a trace asks
    tracer.trace(EVENT_ID)
    tracer.trace(EVENT_ID)
    assert len(traces.made) == 1 and traces.lent == [traces.made[0]] * 2
    tracer.close()
    assert traces.made[0].closed


def test_the_outbox_and_lake_step_borrows_no_reader(tmp_path: Path, traces: Traces) -> None:
    tracer = Tracer(pipeline_for(tmp_path), None)
    tracer.trace(EVENT_ID, search_kafka=False)
    assert traces.made == [] and traces.lent == [None]


def test_a_reader_whose_trace_failed_is_closed_not_kept(tmp_path: Path, traces: Traces) -> None:
    tracer = Tracer(pipeline_for(tmp_path), None)
    traces.fail = True
    with pytest.raises(OSError):
        tracer.trace(EVENT_ID)
    assert traces.made[0].closed
    traces.fail = False
    tracer.trace(EVENT_ID)
    assert len(traces.made) == 2 and not traces.made[1].closed


def test_traces_at_once_each_have_a_reader_and_at_most_keep_stay(
    tmp_path: Path, traces: Traces, monkeypatch: pytest.MonkeyPatch
) -> None:
    tracer = Tracer(pipeline_for(tmp_path), None, keep=2)
    inside = threading.Barrier(3, timeout=10)
    event = traces.event

    def together(*args: Any, **options: Any) -> Lineage:
        inside.wait()  # three traces hold a reader at the same time
        return event(*args, **options)

    monkeypatch.setattr(trace, "trace_event", together)
    threads = [threading.Thread(target=tracer.trace, args=(EVENT_ID,)) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)
    assert len({id(reader) for reader in traces.lent}) == 3
    assert sorted(reader.closed for reader in traces.made) == [False, False, True]
    tracer.close()
    assert all(reader.closed for reader in traces.made)


def test_a_reader_given_back_after_the_console_stopped_is_closed(
    tmp_path: Path, traces: Traces, monkeypatch: pytest.MonkeyPatch
) -> None:
    tracer = Tracer(pipeline_for(tmp_path), None)
    event = traces.event

    def stopping(*args: Any, **options: Any) -> Lineage:
        tracer.close()  # the console stops while this trace runs
        return event(*args, **options)

    monkeypatch.setattr(trace, "trace_event", stopping)
    tracer.trace(EVENT_ID)
    assert traces.made[0].closed
    with pytest.raises(RuntimeError, match="stopping"):
        tracer.trace(EVENT_ID)


def test_the_lineage_shows_the_outbox_and_lake_first_then_asks_for_kafka(
    tmp_path: Path, traces: Traces
) -> None:
    console = Console(pipeline_for(tmp_path), Guard(None), store=object(), watches=[])  # type: ignore[arg-type]
    with TestClient(create_app(console), base_url="http://127.0.0.1:58088") as client:
        first = client.get(f"/fragments/lineage?id={EVENT_ID}&scan=1")
        assert first.status_code == 200
        assert "Searching Kafka for" in first.text
        assert f'hx-get="/fragments/lineage?id={EVENT_ID}&amp;scan=1&amp;kafka=1"' in first.text
        assert "outbox trace" not in first.text  # its lines once Kafka is searched
        second = client.get(f"/fragments/lineage?id={EVENT_ID}&scan=1&kafka=1")
        assert second.status_code == 200
        assert "hx-get" not in second.text
        assert "Found" in second.text and "outbox.event.order[0]@7" in second.text
    assert traces.lent[0] is None and isinstance(traces.lent[1], FakeReader)
    assert traces.made[0].closed  # the console stopped: its readers closed
