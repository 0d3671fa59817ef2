"""The lake source's offset decisions: admission control and lost data (no broker involved:
the broker's answers are given)."""

from __future__ import annotations

from typing import Any

import pytest
from kafka import TopicPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

from lake.kafka_source import DataLossError, _KafkaStreamReader
from lake.records import event_time_of, parse_one
from outbox import new_event_id


class Answers(_KafkaStreamReader):
    """The reader with the broker's answers made up: (beginning, end) per partition."""

    def __init__(self, bounds: dict[TopicPartition, tuple[int, int]], **options: Any) -> None:
        super().__init__(
            bootstrap_servers="unused:1",
            pattern="^t",
            max_records=options.pop("max_records", 100),
            fail_on_data_loss=options.pop("fail_on_data_loss", True),
            end_offsets="broker",
        )
        self.answers = bounds

    def _bounds(self) -> tuple[dict[Any, int], dict[Any, int]]:
        return (
            {tp: begin for tp, (begin, _) in self.answers.items()},
            {tp: end for tp, (_, end) in self.answers.items()},
        )


A0, A1, B0 = TopicPartition("ta", 0), TopicPartition("ta", 1), TopicPartition("tb", 0)


def test_admission_control_shares_the_limit_between_partitions() -> None:
    reader = Answers({A0: (0, 1000), A1: (0, 10), B0: (0, 1000)})
    end = reader.latestOffset({}, ReadMaxRows(90))
    assert end == {"ta": {"0": 30, "1": 10}, "tb": {"0": 30}}
    span = sum(end["ta"].values()) + sum(end["tb"].values())
    assert span <= 90
    assert reader.latestOffset({}, ReadAllAvailable()) == {
        "ta": {"0": 1000, "1": 10},
        "tb": {"0": 1000},
    }


def test_a_partition_with_nothing_new_keeps_its_offset() -> None:
    reader = Answers({A0: (0, 5)})
    assert reader.latestOffset({"ta": {"0": 5}}, ReadMaxRows(10)) == {"ta": {"0": 5}}
    ranges = reader.partitions({"ta": {"0": 5}}, {"ta": {"0": 5}})
    assert ranges == []


def test_records_lost_to_retention_stop_the_query_with_a_clear_error() -> None:
    reader = Answers({A0: (500, 900)})
    with pytest.raises(DataLossError, match=r"ta\[0\]: offsets 100 to 499 were deleted"):
        reader.latestOffset({"ta": {"0": 100}}, ReadMaxRows(1000))


def test_lost_records_are_skipped_when_asked() -> None:
    reader = Answers({A0: (500, 900)}, fail_on_data_loss=False)
    assert reader.latestOffset({"ta": {"0": 100}}, ReadAllAvailable()) == {"ta": {"0": 900}}


def test_parse_one_sorts_records_into_events_and_quarantine() -> None:
    event_id = new_event_id()
    headers = [("id", str(event_id).encode()), ("eventType", b"Placed"), ("traceparent", b"")]
    good = parse_one("outbox.event.order", 0, 7, b"42", b'{"a": 1}', [*headers, ("headers", b"{}")])
    assert good["kind"] == "event" and good["aggregate_type"] == "order"
    assert good["event_time"] == event_time_of(event_id) and good["payload"] == '{"a":1}'
    for value, extra, reason in (
        (b"{nope", [], "not JSON"),
        (b"{}", [("headers", b"[1]")], "not a JSON object"),
        (None, [], "tombstone"),
    ):
        bad = parse_one("outbox.event.order", 0, 8, b"42", value, [*headers, *extra])
        assert bad["kind"] == "quarantine" and reason in bad["reason"], bad
    no_id = parse_one("outbox.event.order", 0, 9, None, b"{}", [("eventType", b"X")])
    assert "no 'id' header" in no_id["reason"]
