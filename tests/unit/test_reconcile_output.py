"""What `outbox reconcile` prints when the lake is behind: not a bare "no findings"."""

from __future__ import annotations

import pytest

from outbox_cli.reconcile import _print_report
from outbox_reconcile.evidence import Evidence
from outbox_reconcile.findings import compare
from tests.unit.test_reconcile_findings import IDS, TOPIC, kafka


def test_a_lake_behind_kafka_is_said_with_what_to_check(capsys: pytest.CaptureFixture[str]) -> None:
    evidence = Evidence()
    evidence.add_kafka([kafka(i, i, i + 1) for i in range(5)])
    evidence.set_kafka_range(TOPIC, 0, 0, 5)
    evidence.add_lake([(IDS[0], "order", "1", 1, TOPIC, 0, 0, "aggregate_order")])
    evidence.add_typed("order", "aggregate_order", IDS[:1])
    evidence.set_lake_progress(TOPIC, 0, 1)
    _print_report(compare(evidence))
    printed = capsys.readouterr().out
    assert "the lake is 4 events behind Kafka" in printed
    assert "is `outbox lake ingest` running?" in printed
    assert "no findings among what the lake has taken in (4 not yet)" in printed
