"""The console's panels without services: which path delivers (a pure decision), and how a
component that fails or is slow shows (down with its reason, "no answer in N s"), never as a
server error."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from outbox.settings import KafkaSettings, OutboxSettings
from outbox_connect.client import ConnectorState
from outbox_connect.settings import ConnectorSettings
from outbox_connect.status import ConnectStatus
from outbox_console import Console, ConsoleSettings, Guard, Pipeline, create_app
from outbox_console.panels import (
    DOWN,
    OK,
    SLOW,
    WARN,
    Panel,
    RelayView,
    delivery_path,
    reconcile_panel,
    relays_panel,
)
from outbox_console.watch import Watch
from outbox_lake.settings import LakeSettings


def connect(state: str | None) -> ConnectStatus:
    found = None if state is None else ConnectorState("c", state, [(0, state, None)])
    return ConnectStatus("c", found, "offsets", [])


def relay(*, mode: str = "auto", leader: bool = True, publishing: bool = False) -> RelayView:
    return RelayView("http://r", True, True, "ok", mode=mode, leader=leader, publishing=publishing)


def test_the_delivery_path_is_cdc_or_the_relay_and_says_why() -> None:
    assert delivery_path(connect("RUNNING"), [relay()]).value == "CDC (Debezium)"
    assert delivery_path(connect("RUNNING"), [relay()]).tone == OK
    took_over = delivery_path(None, [relay(publishing=True)])
    assert "took over" in took_over.value and took_over.tone == WARN
    polling = delivery_path(None, [relay(mode="polling", publishing=True)])
    assert "polling" in polling.value and polling.tone == OK
    waiting = delivery_path(connect("FAILED"), [relay()])
    assert "grace period" in waiting.value and waiting.tone == WARN
    nothing = delivery_path(None, [RelayView("http://r", False, False, "no answer")])
    assert nothing.tone == DOWN
    leaderless = delivery_path(connect("RUNNING"), [relay(leader=False)])
    assert "no relay leads" in leaderless.value


def test_replicas_that_share_the_slices_show_each_share() -> None:
    views = [
        RelayView(f"http://r{n}", True, True, "ok", mode="polling", leader=True, slices=share)
        for n, share in enumerate((11, 11, 10))
    ]
    panel = relays_panel([*views, RelayView("http://r3", True, True, "ok", mode="polling")])
    assert panel.state == OK
    assert panel.summary == "3 replicas share the slices (11 + 11 + 10)"
    assert [fact.value.split(",")[0] for fact in panel.facts[:4]] == [
        "leads 11 slices",
        "leads 11 slices",
        "leads 10 slices",
        "standby",
    ]
    short = relays_panel(views[:2])
    assert short.state == WARN
    assert short.facts[-1].value.startswith("10 of 32 held by no replica listed here")
    views[1] = RelayView(
        "http://r1", True, False, "retrying", mode="polling", leader=True, slices=11
    )
    assert relays_panel(views).state == WARN, "one that leads is not ready"


def test_a_read_that_fails_shows_down_with_the_reason() -> None:
    def broken() -> Panel:
        raise ConnectionRefusedError(111, "Connection refused")

    watch = Watch("Broker", broken, interval_seconds=0.05, answer_seconds=1).start()
    try:
        deadline = time.monotonic() + 10
        while watch.panel().state != DOWN:
            assert time.monotonic() < deadline, watch.panel()
            time.sleep(0.01)
        assert "Connection refused" in watch.panel().summary
    finally:
        watch.stop()


def test_a_read_that_hangs_shows_no_answer_with_the_last_one() -> None:
    release = threading.Event()
    calls: list[int] = []

    def slow() -> Panel:
        calls.append(1)
        if len(calls) > 1:
            release.wait(10)
        return Panel("Lake", OK, "up to date")

    watch = Watch("Lake", slow, interval_seconds=0.01, answer_seconds=0.2).start()
    try:
        deadline = time.monotonic() + 10
        while watch.panel().state != SLOW:
            assert time.monotonic() < deadline, watch.panel()
            time.sleep(0.01)
        shown = watch.panel()
        assert shown.summary.startswith("no answer in 0.2 s") and "last answer" in shown.summary
    finally:
        release.set()
        watch.stop()


class FailingStore:
    def listing(self) -> None:
        raise OSError("connection to server at 127.0.0.1 port 1 failed: Connection refused")


@pytest.fixture
def failing_console(tmp_path: Path) -> TestClient:
    pipeline = Pipeline(
        console=ConsoleSettings(),
        database_url="postgresql+psycopg://u:p@127.0.0.1:1/x",
        outbox=OutboxSettings(),
        connector=ConnectorSettings(),
        kafka=KafkaSettings(bootstrap_servers="127.0.0.1:1"),
        lake=LakeSettings(root=str(tmp_path)),
    )

    def down() -> Panel:
        raise OSError("no route")

    watches = [Watch("Broker", down, interval_seconds=0.05, answer_seconds=1)]
    console = Console(pipeline, Guard(None), store=FailingStore(), watches=watches)  # type: ignore[arg-type]
    return TestClient(create_app(console), base_url="http://127.0.0.1:58088")


def test_a_component_down_is_a_page_that_says_so_never_a_server_error(
    failing_console: TestClient,
) -> None:
    with failing_console as client:
        deadline = time.monotonic() + 10
        while 'data-state="down"' not in (page := client.get("/fragments/overview").text):
            assert time.monotonic() < deadline, page
            time.sleep(0.02)
        assert "OSError: no route" in page
        letters = client.get("/dead-letters")
        assert letters.status_code == 200
        assert "The database did not answer: OSError: connection to server" in letters.text
        assert "app;dur=" in letters.headers["Server-Timing"]


def reconcile_pipeline(tmp_path: Path, metrics_file: Path | None) -> Pipeline:
    return Pipeline(
        console=ConsoleSettings(reconcile_metrics_file=metrics_file),
        database_url="postgresql+psycopg://u:p@127.0.0.1:1/x",
        outbox=OutboxSettings(),
        connector=ConnectorSettings(),
        kafka=KafkaSettings(bootstrap_servers="127.0.0.1:1"),
        lake=LakeSettings(root=str(tmp_path)),
    )


def test_reconcile_findings_show_down_by_kind_and_aggregate_from_its_metrics_file(
    tmp_path: Path,
) -> None:
    from outbox_reconcile.findings import Finding, Report
    from outbox_reconcile.metrics import ReconcileMetrics

    path = tmp_path / "outbox_reconcile.prom"
    assert "not set up" in reconcile_panel(reconcile_pipeline(tmp_path, None)).summary
    assert "no run yet" in reconcile_panel(reconcile_pipeline(tmp_path, path)).summary

    metrics = ReconcileMetrics()  # the file as `outbox reconcile --metrics-file` writes it
    metrics.record(
        Report(
            "all",
            [Finding("dead_letter", "order", 2), Finding("missing_in_lake", "payment", 1)],
            {"lake_pending_ingest": 40},
        )
    )
    metrics.write(str(path))
    found = reconcile_panel(reconcile_pipeline(tmp_path, path))
    assert (found.state, found.summary) == (DOWN, "3 finding(s) in the last run")
    facts = {fact.label: (fact.value, fact.tone) for fact in found.facts}
    assert facts["dead_letter [order]"] == ("2", DOWN)
    assert facts["missing_in_lake [payment]"] == ("1", DOWN)
    assert facts["not in the lake yet"] == ("40 events (not judged)", "")
    assert facts["last run"][0].endswith("s ago")

    clean = ReconcileMetrics()
    clean.record(Report("all", [], {}))
    clean.write(str(path))
    quiet = reconcile_panel(reconcile_pipeline(tmp_path, path))
    assert quiet.state == OK and quiet.summary.startswith("no findings in the last run")
