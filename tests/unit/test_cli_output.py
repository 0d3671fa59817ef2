"""What commands print for people: no Python reprs, the address tried, an `error:` prefix."""

from __future__ import annotations

import socket
from datetime import UTC, datetime
from decimal import Decimal

from typer.testing import CliRunner

from outbox_cli.main import app
from outbox_reconcile.trace import Lineage

EVENT = "0190c5a8-9c1e-7000-8000-000000000000"


def test_trace_lines_read_as_text_and_tell_a_kept_row_from_an_undelivered_one() -> None:
    built = datetime(2026, 11, 28, 12, 0, tzinfo=UTC)
    kept = Lineage(
        EVENT,
        built,
        outbox={"position": 7, "created_at": built},
        kafka=[{"topic": "outbox.event.order", "partition": 0, "offset": 3}],
        lake=[{"ingest_time": built, "total": Decimal("9.900000000000000000")}],
    )
    text = "\n".join(kept.lines())
    assert "datetime.datetime(" not in text and "Decimal(" not in text and "{" not in text
    assert "row kept until cleanup" in text and "created_at 2026-11-28T12:00:00+00:00" in text
    assert "total 9.9" in text
    waiting = "\n".join(Lineage(EVENT, built, outbox={"position": 7}).lines())
    assert "row present, not delivered yet: position 7" in waiting


def test_a_bad_event_id_is_an_error_that_says_so() -> None:
    result = CliRunner().invoke(app, ["trace", "not-a-uuid"])
    assert result.exit_code == 2
    assert result.stderr.startswith("error: EVENT_ID 'not-a-uuid' is not a UUID")


def test_relay_health_names_the_address_it_tried() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    result = CliRunner().invoke(app, ["relay", "health"], env={"OUTBOX_RELAY_HTTP_PORT": str(port)})
    assert result.exit_code == 1
    assert f"no answer at http://127.0.0.1:{port}/healthz" in result.stdout


def test_trace_prints_the_trace_id_of_the_event_s_traceparent() -> None:
    built = datetime(2026, 11, 28, 12, 0, tzinfo=UTC)
    traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    traced = Lineage(EVENT, built, lake=[{"offset": 3, "traceparent": traceparent}], outbox=None)
    text = "\n".join(traced.lines())
    assert "trace id 0af7651916cd43dd8448eb211c80319c" in text
    assert "b7ad6b7169203331" not in text  # the span id is not the trace's: not shown
    assert traced.to_dict()["trace_id"] == "0af7651916cd43dd8448eb211c80319c"
    untraced = "\n".join(Lineage(EVENT, built, lake=[{"offset": 3, "traceparent": ""}]).lines())
    assert "no traceparent" in untraced
