"""The commands that list things: a table for people, JSON for scripts, one summary line;
nothing on stdout when there is nothing to list. (Pure: the data sources are stand-ins.)"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from outbox.consumer_dead_letters import DeadLetterPlace, DeadLetterSummary
from outbox.effect_decisions import ParkedStep
from outbox_cli import consumer, effects, lake, relay, stack
from outbox_cli._output import json_text, printable, table_text
from outbox_cli.main import app
from outbox_lake.query import Freshness, TableInfo
from outbox_relay.dead_letters import DeadLetter
from outbox_stack.local import ServiceLine

NOW = datetime(2026, 11, 28, 12, 0, tzinfo=UTC)
EVENT = "0190c5a8-9c1e-7000-8000-000000000000"


def test_a_cell_is_shown_as_given_never_as_markup_and_with_controls_escaped() -> None:
    text = table_text(["reason"], [["[red]boom[/red] \x1b[2J\u200b"], [None]])
    assert "[red]boom[/red]" in text and "\\x1b[2J" in text and "\\u200b" in text
    assert "\x1b" not in text and "\u200b" not in text
    assert "│ -" in text, "None is shown as -"
    assert printable("two\nlines\t") == "two\nlines\\t"


def test_a_long_path_is_folded_never_cut() -> None:
    path = "/a/very/long/folder/" + "x" * 60 + "/postgres.log"
    text = table_text(["log"], [[path]], width=40)
    assert "…" not in text
    assert "".join(line.strip("│ ") for line in text.splitlines()[3:-1]) == path


def test_json_writes_times_decimals_ids_and_paths_as_text() -> None:
    document = {
        "at": NOW,
        "total": Decimal("9.90"),
        "id": uuid.UUID(EVENT),
        "log": Path("/var/log/x.log"),
        "n": 3,
        "none": None,
    }
    assert json.loads(json_text(document)) == {
        "at": "2026-11-28T12:00:00+00:00",
        "total": "9.90",
        "id": EVENT,
        "log": "/var/log/x.log",
        "n": 3,
        "none": None,
    }


# -- outbox lake tables ---------------------------------------------------------------------

TABLES = [
    TableInfo("aggregate_order", 1_234_567, 12, NOW),
    TableInfo("events", 5, 3, None),
]
FRESH = Freshness(NOW - timedelta(seconds=2), NOW - timedelta(seconds=3), 0)


@pytest.fixture
def a_lake(monkeypatch: pytest.MonkeyPatch) -> list[TableInfo]:
    """`lake tables` over stand-ins: the tables it lists are the returned list's."""
    import outbox_lake.query

    listed = list(TABLES)
    monkeypatch.setattr(lake, "existing_lake", lambda: object())
    monkeypatch.setattr(lake, "kafka_settings", lambda: object())
    monkeypatch.setattr(outbox_lake.query, "list_tables", lambda _lake: listed)
    monkeypatch.setattr(outbox_lake.query, "freshness", lambda _lake, _kafka: FRESH)
    return listed


def test_lake_tables_shows_a_table_and_ends_with_the_freshness_line(
    a_lake: list[TableInfo],
) -> None:
    result = CliRunner().invoke(app, ["lake", "tables"])
    assert result.exit_code == 0, result.output
    *table, last = result.stdout.splitlines()
    assert last.startswith("freshness: last commit ") and "up to date with Kafka" in last
    rows = "\n".join(table)
    assert "aggregate_order" in rows and "1,234,567" in rows and "2026-11-28T12:00:00" in rows


def test_an_empty_lake_lists_only_its_freshness(a_lake: list[TableInfo]) -> None:
    a_lake.clear()
    result = CliRunner().invoke(app, ["lake", "tables"])
    assert len(result.stdout.splitlines()) == 1
    assert result.stdout.startswith("freshness: last commit ")


def test_lake_tables_json_holds_the_tables_and_the_freshness(a_lake: list[TableInfo]) -> None:
    result = CliRunner().invoke(app, ["lake", "tables", "--json"])
    assert result.exit_code == 0, result.output
    found = json.loads(result.stdout)
    assert found["tables"][0] == {
        "name": "aggregate_order",
        "rows": 1_234_567,
        "version": 12,
        "last_update": "2026-11-28T12:00:00+00:00",
    }
    assert found["tables"][1]["last_update"] is None
    freshness = found["freshness"]
    assert freshness["behind"] == 0 and freshness["last_commit"] == "2026-11-28T11:59:58+00:00"
    assert freshness["line"].startswith("freshness: last commit ")


def test_the_freshness_says_why_the_lag_is_unknown_in_json() -> None:
    found = Freshness(None, None, None, unknown_reason="no events table yet")
    freshness = lake.tables_object([], found, NOW)["freshness"]
    assert isinstance(freshness, dict)
    assert freshness["unknown_reason"] == "no events table yet" and freshness["behind"] is None
    assert freshness["line"] == (
        "freshness: last commit never, newest event never; "
        "lag behind Kafka unknown (no events table yet)"
    )


# -- outbox consumer dead-letters list ------------------------------------------------------

LETTER = DeadLetterSummary(
    place=DeadLetterPlace("shipping", "outbox.event.order", 0, 3),
    event_id=EVENT,
    headers=(),
    reason="RuntimeError: the handler\ncannot take n=1 yet",
    attempts=2,
    failed_at=NOW,
    key_bytes=2,
    value_bytes=1_500,
)


@pytest.fixture
def consumer_letters(monkeypatch: pytest.MonkeyPatch) -> list[DeadLetterSummary]:
    import outbox.consumer_dead_letters

    letters = [LETTER]

    @contextmanager
    def database() -> Iterator[tuple[Any, Any]]:
        engine = type("Engine", (), {"begin": lambda self: nullcontext(None)})()
        yield engine, None

    monkeypatch.setattr(consumer, "_database", database)
    monkeypatch.setattr(
        outbox.consumer_dead_letters, "list_dead_letters", lambda *_a, **_k: letters
    )
    return letters


def test_consumer_dead_letters_are_a_table_and_a_count_on_stderr(
    consumer_letters: list[DeadLetterSummary],
) -> None:
    result = CliRunner().invoke(app, ["consumer", "dead-letters", "list"])
    assert result.exit_code == 0, result.output
    assert "outbox.event.order[0]@3" in result.stdout and "1,500" in result.stdout
    assert "the handler cannot take n=1 yet" in result.stdout, "the reason on one line"
    assert result.stderr == "1 dead letter(s)\n"


def test_no_consumer_dead_letters_print_nothing_on_stdout(
    consumer_letters: list[DeadLetterSummary],
) -> None:
    consumer_letters.clear()
    result = CliRunner().invoke(app, ["consumer", "dead-letters", "list"])
    assert result.stdout == "" and result.stderr == "0 dead letter(s)\n"
    listed = CliRunner().invoke(app, ["consumer", "dead-letters", "list", "--json"])
    assert json.loads(listed.stdout) == []


def test_consumer_dead_letters_json_names_the_record_by_its_parts(
    consumer_letters: list[DeadLetterSummary],
) -> None:
    result = CliRunner().invoke(app, ["consumer", "dead-letters", "list", "--json"])
    assert json.loads(result.stdout) == [
        {
            "consumer": "shipping",
            "topic": "outbox.event.order",
            "partition": 0,
            "offset": 3,
            "event_id": EVENT,
            "attempts": 2,
            "failed_at": "2026-11-28T12:00:00+00:00",
            "key_bytes": 2,
            "value_bytes": 1_500,
            "reason": "RuntimeError: the handler\ncannot take n=1 yet",
            "replay_refusal": LETTER.replay_refusal(),
        }
    ]


def test_a_record_without_an_event_id_says_so() -> None:
    raw = DeadLetterSummary(LETTER.place, None, (), "not an outbox record", 1, NOW, None, None)
    (row,) = consumer.dead_letter_rows([raw])
    assert row[2] == "(no event id)" and row[5] == "0"
    assert consumer.dead_letter_object(raw)["event_id"] is None


# -- outbox relay dead-letters list ---------------------------------------------------------


def test_relay_dead_letters_as_rows_and_as_json() -> None:
    letter = DeadLetter(
        uuid.UUID(EVENT), "order", "42", "OrderPlaced", "MessageSizeTooLarge", NOW, 2_000_000
    )
    (row,) = relay.dead_letter_rows([letter])
    assert row[1:4] == ("order/42", "OrderPlaced", "2,000,000")
    assert json.loads(json_text(relay.dead_letter_object(letter))) == {
        "event_id": EVENT,
        "aggregate_type": "order",
        "aggregate_id": "42",
        "event_type": "OrderPlaced",
        "payload_bytes": 2_000_000,
        "failed_at": "2026-11-28T12:00:00+00:00",
        "reason": "MessageSizeTooLarge",
    }


# -- outbox effects list --------------------------------------------------------------------

STEP = ParkedStep(
    consumer="billing",
    event_id=EVENT,
    effect="charge",
    idempotency_key=uuid.UUID("00000000-0000-4000-8000-000000000001"),
    attempt=1,
    context={"order_id": "42", "amount": Decimal("9.90")},
    reason="the call was cut short",
    started_at=NOW - timedelta(seconds=100),
    parked_at=NOW - timedelta(seconds=90),
)


def test_a_parked_step_shows_its_age_reason_and_context() -> None:
    (row,) = effects.step_rows([STEP], NOW)
    assert row[:5] == ("billing", EVENT, "charge", STEP.idempotency_key, 1)
    assert row[5] == "2026-11-28T11:58:30+00:00\n(90 s ago)"
    assert row[6] == ('reason: the call was cut short\ncontext: {"order_id":"42","amount":9.90}')


def test_a_parked_step_in_json_keeps_its_whole_context() -> None:
    found = json.loads(json_text(effects.step_object(STEP, NOW)))
    assert found["idempotency_key"] == "00000000-0000-4000-8000-000000000001"
    assert found["waited_seconds"] == 90 and found["parked_at"] == "2026-11-28T11:58:30+00:00"
    assert found["context"] == {"order_id": "42", "amount": "9.90"}  # a decimal stays exact


# -- outbox stack status --------------------------------------------------------------------

SERVICES = [
    ServiceLine("postgres", True, "127.0.0.1:54329", 101, "/s/postgres.log", "/s/postgres/data"),
    ServiceLine("broker", True, "kafka://127.0.0.1:59092", 102, "/s/broker.log", "/s/kafka"),
    ServiceLine("lake", False, "ingest job into /s/.lake", None, "/s/lake.log"),
]


def test_services_are_rows_with_their_files_in_one_cell() -> None:
    rows = stack.service_rows(SERVICES)
    assert rows[0] == (
        "postgres",
        "running",
        101,
        "127.0.0.1:54329",
        "log  /s/postgres.log\ndata /s/postgres/data",
    )
    assert rows[2][1:3] == ("stopped", None) and rows[2][4] == "log  /s/lake.log"
    assert stack.services_summary(SERVICES) == "2 of 3 services running; stopped: lake"
    assert stack.services_summary(SERVICES[:2]) == "2 of 2 services running"


def test_stack_status_json_has_each_service_and_exits_1_when_one_is_down(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    settings = type("Settings", (), {"root": Path("/s")})()
    stand_in = type("Stack", (), {"settings": settings, "status": lambda self: SERVICES})()
    monkeypatch.setattr(stack, "_stack", lambda: stand_in)
    monkeypatch.setattr(stack, "_where_from", lambda _settings: " (OUTBOX_STACK_DIR)")
    result = CliRunner().invoke(app, ["stack", "status", "--json"])
    assert result.exit_code == 1
    found = json.loads(result.stdout)
    assert (found["folder"], found["found"], found["running"]) == ("/s", "OUTBOX_STACK_DIR", False)
    assert found["services"][1] == {
        "name": "broker",
        "running": True,
        "pid": 102,
        "address": "kafka://127.0.0.1:59092",
        "log": "/s/broker.log",
        "data": "/s/kafka",
    }
    shown = CliRunner().invoke(app, ["stack", "status"])
    assert shown.stdout.startswith("stack folder /s (OUTBOX_STACK_DIR)\n")
    assert shown.stdout.endswith("2 of 3 services running; stopped: lake\n")


# -- outbox connect status ------------------------------------------------------------------


def test_connect_status_lines_and_json_say_the_same() -> None:
    from outbox_connect.client import ConnectorState
    from outbox_connect.open_transactions import OpenTransaction
    from outbox_connect.status import ConnectStatus, SlotState

    hanging = OpenTransaction(
        topic="connect-offsets",
        partition=0,
        producer_id=7,
        producer_epoch=1,
        coordinator_epoch=0,
        first_offset=12,
        idle_seconds=600.4,
        transactional_id="connect-cluster-outbox-0",
        coordinator_state=None,
        coordinator_outcome="CompleteCommit",
    )
    slot = SlotState("outbox_slot", "active", 56_000, "reserved", "-1")
    state = ConnectorState("outbox", "RUNNING", [(0, "FAILED", "java.lang.Boom: no\n\tat x")])
    report = ConnectStatus("outbox", state, "connect-offsets", [hanging], None, slot)
    lines = report.lines()
    assert lines[:3] == ["connector outbox: RUNNING", "  task 0: FAILED", "    java.lang.Boom: no"]
    assert lines[3] == hanging.describe() and "outbox connect unblock" in lines[4]
    assert lines[5] == "slot outbox_slot: active, retained WAL 56,000 bytes, wal_status reserved"
    assert lines[6].startswith("max_slot_wal_keep_size: unlimited.")
    assert not report.ok
    found = json.loads(json_text(report.to_dict()))
    assert found["ok"] is False and found["connector"]["running"] is False
    assert found["connector"]["tasks"] == [
        {"id": 0, "state": "FAILED", "trace": "java.lang.Boom: no\n\tat x"}
    ]
    (open_one,) = found["offsets_topic"]["open_transactions"]
    assert open_one["hanging"] and open_one["abort_redelivers"] and open_one["first_offset"] == 12
    assert found["offsets_topic"]["hanging"] and found["offsets_topic"]["checked"]
    assert found["slot"]["retained_wal_bytes"] == 56_000 and found["slot"]["unbounded"]


def test_connect_status_without_a_connector_broker_or_slot() -> None:
    from outbox_connect.status import ConnectStatus, SlotState

    report = ConnectStatus("outbox", None, "connect-offsets", [], "Kafka is not reachable")
    assert report.lines() == [
        "connector outbox: not created (run `outbox connect apply`)",
        "offsets topic connect-offsets: not checked (Kafka is not reachable)",
    ]
    found = report.to_dict()
    assert found["slot"] is None and found["ok"] is False
    assert found["connector"] == {"name": "outbox", "state": None, "running": False, "tasks": []}
    missing = SlotState("outbox_slot", None, 0, "unknown", "10GB")
    assert missing.lines() == [
        "slot outbox_slot: missing",
        "max_slot_wal_keep_size: 10GB (past it the slot is invalidated: recreate the "
        "connector; the relay in auto mode publishes meanwhile)",
    ]
