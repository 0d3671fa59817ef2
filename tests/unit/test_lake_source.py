"""The lake source's offset decisions: admission control and lost data (no broker involved:
the broker's answers are given)."""

from __future__ import annotations

from typing import Any

import pytest
from kafka import TopicPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

from outbox import new_event_id
from outbox_lake.kafka_source import (
    LAST_RECORDS,
    REREAD,
    TOPIC_IDS,
    DataLossError,
    _KafkaStreamReader,
    positions_of,
)
from outbox_lake.records import event_time_of, parse_one


class Answers(_KafkaStreamReader):
    """The reader with the broker's answers made up: (beginning, end) per partition."""

    def __init__(
        self,
        bounds: dict[TopicPartition, tuple[int, int]],
        ids: dict[str, str] | None = None,
        **options: Any,
    ) -> None:
        super().__init__(
            bootstrap_servers="unused:1",
            pattern="^t",
            max_records=options.pop("max_records", 100),
            fail_on_data_loss=options.pop("fail_on_data_loss", True),
            end_offsets="broker",
        )
        self.answers = bounds
        self.ids = ids or {}  # the topics' ids in the broker's metadata (none: an old broker)

    def _bounds(self) -> tuple[dict[Any, int], dict[Any, int]]:
        self._ids_now = dict(self.ids)
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


def test_the_offsets_record_each_topics_id_and_an_old_checkpoint_adopts_them() -> None:
    reader = Answers({A0: (0, 5), B0: (0, 2)}, ids={"ta": "id-a", "tb": "id-b"})
    assert reader.latestOffset({}, ReadAllAvailable()) == {
        "ta": {"0": 5},
        "tb": {"0": 2},
        TOPIC_IDS: {"ta": "id-a", "tb": "id-b"},
    }
    # A checkpoint from before ids were recorded, and a topic gone from the broker since:
    # the ids seen now are adopted; the gone topic keeps its offsets and its id.
    start = {"ta": {"0": 3}, "tgone": {"0": 7}, TOPIC_IDS: {"tgone": "id-gone"}}
    end = Answers({A0: (0, 5)}, ids={"ta": "id-a"}).latestOffset(start, ReadAllAvailable())
    assert end == {"ta": {"0": 5}, "tgone": {"0": 7}, TOPIC_IDS: {"tgone": "id-gone", "ta": "id-a"}}


def test_a_recreated_topic_as_long_as_the_old_one_is_data_loss_not_a_silent_skip() -> None:
    # The lake read 5 records of the old topic; the new one (another id) holds 10: by
    # offsets alone, its first 5 would be taken as read.
    start = {"ta": {"0": 5}, TOPIC_IDS: {"ta": "id-old"}}
    recreated = Answers({A0: (0, 10)}, ids={"ta": "id-new"})
    with pytest.raises(DataLossError, match=r"^ta: the topic on the broker is not the one") as e:
        recreated.latestOffset(start, ReadAllAvailable())
    assert "id-new" in str(e.value) and "id-old" in str(e.value)
    assert "OUTBOX_LAKE_FAIL_ON_DATA_LOSS=false" in str(e.value)

    # Asked to go on: the new topic from its start (its earliest offset, 3: retention ran on
    # it too), not from 5 where the old one stood.
    skipping = Answers({A0: (3, 10)}, ids={"ta": "id-new"}, fail_on_data_loss=False)
    end = skipping.latestOffset(start, ReadAllAvailable())
    assert end == {"ta": {"0": 10}, TOPIC_IDS: {"ta": "id-new"}, REREAD: {"ta": {"0": 3}}}
    (whole,) = skipping.partitions(start, end)
    assert (whole.start, whole.end) == (3, 10)  # type: ignore[attr-defined]
    (replayed,) = Answers({A0: (3, 10)}, ids={"ta": "id-new"}).partitions(start, end)
    assert (replayed.start, replayed.end) == (3, 10)  # type: ignore[attr-defined]
    steady = skipping.latestOffset(end, ReadAllAvailable())  # the next trigger: nothing new
    assert steady == {"ta": {"0": 10}, TOPIC_IDS: {"ta": "id-new"}}
    assert skipping.partitions(end, steady) == []


def test_a_batch_replayed_after_its_topic_was_recreated_is_data_loss() -> None:
    start = {"ta": {"0": 5}, TOPIC_IDS: {"ta": "id-old"}}
    planned = {"ta": {"0": 8}, TOPIC_IDS: {"ta": "id-old"}}
    restarted = Answers({A0: (0, 10)}, ids={"ta": "id-new"})  # no latestOffset before replay
    with pytest.raises(DataLossError, match=r"^ta: the topic on the broker is not the one"):
        restarted.partitions(start, planned)
    unchanged = Answers({A0: (0, 10)}, ids={"ta": "id-old"})
    (batch,) = unchanged.partitions(start, planned)
    assert (batch.start, batch.end) == (5, 8)  # type: ignore[attr-defined]
    skipping = Answers({A0: (2, 10)}, ids={"ta": "id-new"}, fail_on_data_loss=False)
    (reread,) = skipping.partitions(start, planned)
    assert (reread.start, reread.end) == (2, 8)  # type: ignore[attr-defined]


def test_parse_one_sorts_records_into_events_and_quarantine() -> None:
    event_id = new_event_id()
    headers = [("id", str(event_id).encode()), ("eventType", b"Placed"), ("traceparent", b"")]
    good = parse_one("outbox.event.order", 0, 7, b"42", b'{"a": 1}', [*headers, ("headers", b"{}")])
    assert good["kind"] == "event" and good["aggregate_type"] == "order"
    assert good["event_time"] == event_time_of(event_id) and good["payload"] == '{"a": 1}'
    for value, extra, reason in (
        (b"{nope", [], "not JSON"),
        (b"{}", [("headers", b"[1]")], "not a JSON object"),
        (None, [], "tombstone"),
    ):
        bad = parse_one("outbox.event.order", 0, 8, b"42", value, [*headers, *extra])
        assert bad["kind"] == "quarantine" and reason in bad["reason"], bad
    no_id = parse_one("outbox.event.order", 0, 9, None, b"{}", [("eventType", b"X")])
    assert "no 'id' header" in no_id["reason"]


class Record:
    def __init__(
        self, topic: str, partition: int, offset: int, size: int = 10, tag: bytes = b""
    ) -> None:
        self.topic, self.partition, self.offset = topic, partition, offset
        self.key, self.headers, self.timestamp = b"k", [], 0
        self.value = tag + str(offset).encode() + b"v" * size  # each record its own content


class FakeLog:
    """A broker's log as a consumer sees it: offsets present per partition, and what
    fetching an offset outside them does (empty, as Tansu; or out of range, as Kafka)."""

    def __init__(
        self,
        logs: dict[Any, list[int]],
        *,
        out_of_range: bool = False,
        size: int = 10,
        tag: bytes = b"",
    ):
        self.logs, self.out_of_range, self.size, self.tag = logs, out_of_range, size, tag
        self.at: dict[Any, int] = {}
        self.paused: set[Any] = set()

    def assign(self, partitions: list[Any]) -> None:
        self.at = {tp: 0 for tp in partitions}

    def seek(self, tp: Any, offset: int) -> None:
        self.at[tp] = offset

    def position(self, tp: Any) -> int:
        return self.at[tp]

    def pause(self, *tps: Any) -> None:
        self.paused |= set(tps)

    def resume(self, *tps: Any) -> None:
        self.paused -= set(tps)

    def beginning_offsets(self, tps: list[Any]) -> dict[Any, int]:
        return {tp: min(self.logs[tp], default=0) for tp in tps}

    def end_offsets(self, tps: list[Any]) -> dict[Any, int]:
        return {tp: max(self.logs[tp], default=-1) + 1 for tp in tps}

    def poll(self, timeout_ms: int = 0, max_records: int = 5000) -> dict[Any, list[Record]]:
        from kafka.errors import OffsetOutOfRangeError

        answer = {}
        for tp, at in self.at.items():
            if tp in self.paused:
                continue
            offsets = [o for o in self.logs[tp] if o >= at][:max_records]
            if not offsets and self.out_of_range and self.logs[tp] and at > max(self.logs[tp]) + 1:
                raise OffsetOutOfRangeError({tp: at})
            if offsets:
                answer[tp] = [
                    Record(tp.topic, tp.partition, o, self.size, self.tag) for o in offsets
                ]
                self.at[tp] = offsets[-1] + 1
        return answer

    def unsubscribe(self) -> None:
        pass

    def close(self) -> None:
        pass


def scanning_reader(log: FakeLog, **options: Any) -> _KafkaStreamReader:
    reader = _KafkaStreamReader(
        bootstrap_servers="unused:1",
        pattern="^t",
        max_records=options.pop("max_records", 1000),
        fail_on_data_loss=options.pop("fail_on_data_loss", True),
        max_bytes=options.pop("max_bytes", 10**9),
    )
    reader._client = log
    reader.probe_seconds = 0.2
    reader.tail_seconds = options.pop("tail_seconds", 0.0)  # fake polls take no time
    reader._record_exists = lambda tp, offset: offset in log.logs[tp]  # type: ignore[method-assign]
    reader._bounds = lambda: (  # type: ignore[method-assign]
        log.beginning_offsets(list(log.logs)),
        log.end_offsets(list(log.logs)),
    )
    return reader


def test_the_byte_budget_bounds_a_batch_but_every_partition_moves() -> None:
    log = FakeLog({A0: list(range(100)), A1: list(range(100))}, size=1000)
    reader = scanning_reader(log, max_bytes=10_000)
    end = reader.latestOffset({}, ReadMaxRows(1000))
    admitted = end["ta"]["0"] + end["ta"]["1"]
    assert 2 <= admitted <= 12, end  # about 10 records of ~1 kB, at least one per partition
    huge = FakeLog({A0: list(range(5))}, size=5_000_000)
    end = scanning_reader(huge, max_bytes=2**20).latestOffset({}, ReadMaxRows(9))
    assert positions_of(end) == {"ta": {"0": 1}}


def test_a_recreated_topic_that_is_shorter_is_detected_by_the_scan() -> None:
    log = FakeLog({A0: [0, 1, 2]})  # the lake stood at 10: offset 9 is gone, nothing deleted
    with pytest.raises(DataLossError, match=r"ta\[0\]: offset 9, which the lake read, is gone"):
        scanning_reader(log).latestOffset({"ta": {"0": 10}}, ReadMaxRows(100))
    skipping = scanning_reader(FakeLog({A0: [0, 1, 2]}), fail_on_data_loss=False)
    end = skipping.latestOffset({"ta": {"0": 10}}, ReadMaxRows(100))
    assert positions_of(end) == {"ta": {"0": 3}} and end[REREAD] == {"ta": {"0": 0}}
    (recreated,) = skipping.partitions({"ta": {"0": 10}}, end)  # the new topic, from its start
    assert (recreated.start, recreated.end) == (0, 3)  # type: ignore[attr-defined]
    steady = scanning_reader(FakeLog({A0: list(range(12))}))
    assert positions_of(steady.latestOffset({"ta": {"0": 10}}, ReadMaxRows(100))) == {
        "ta": {"0": 12}
    }


def test_a_refilled_log_whose_record_before_the_lake_differs_is_data_loss() -> None:
    # The lake read offsets 0-9 of one log and kept the fingerprint of offset 9. The log it
    # meets now (a broker restored from a snapshot and refilled, a checkpoint from before
    # topic ids) has records at 0-14, of other content: by offsets alone, 0-9 would pass.
    old = FakeLog({A0: list(range(10))}, tag=b"old")
    first = scanning_reader(old).latestOffset({}, ReadMaxRows(100))
    assert positions_of(first) == {"ta": {"0": 10}} and "0" in first[LAST_RECORDS]["ta"]
    same = FakeLog({A0: list(range(15))}, tag=b"old")  # the same log, grown
    assert positions_of(scanning_reader(same).latestOffset(first, ReadMaxRows(100))) == {
        "ta": {"0": 15}
    }
    refilled = FakeLog({A0: list(range(15))}, tag=b"new")
    with pytest.raises(DataLossError, match=r"ta\[0\]: the record at offset 9 is not the one"):
        scanning_reader(refilled).latestOffset(first, ReadMaxRows(100))
    skipping = scanning_reader(FakeLog({A0: list(range(15))}, tag=b"new"), fail_on_data_loss=False)
    end = skipping.latestOffset(first, ReadMaxRows(100))
    assert positions_of(end) == {"ta": {"0": 15}} and end[REREAD] == {"ta": {"0": 0}}
    (whole,) = skipping.partitions(first, end)  # the new log from its start, not from 10
    assert (whole.start, whole.end) == (0, 15)  # type: ignore[attr-defined]
    assert end[LAST_RECORDS] != first[LAST_RECORDS]  # the new log's record at 14


def test_the_fingerprint_kept_is_of_the_record_before_the_end_the_budget_allows() -> None:
    log = FakeLog({A0: list(range(100)), A1: list(range(100))})
    reader = scanning_reader(log)
    end = reader.latestOffset({}, ReadMaxRows(20))  # 10 a partition
    assert positions_of(end) == {"ta": {"0": 10, "1": 10}}
    grown = FakeLog({A0: list(range(100)), A1: list(range(100))})
    follow = scanning_reader(grown).latestOffset(end, ReadMaxRows(20))  # probes 9 and 9
    assert positions_of(follow) == {"ta": {"0": 20, "1": 20}}


class GrowingLog(FakeLog):
    """A log written to while it is read: each poll finds ``per_poll`` new records."""

    def __init__(self, logs: dict[Any, list[int]], per_poll: int) -> None:
        super().__init__(logs)
        self.per_poll = per_poll

    def poll(self, timeout_ms: int = 0, max_records: int = 5000) -> dict[Any, list[Record]]:
        answer = super().poll(timeout_ms, max_records)
        for offsets in self.logs.values():
            offsets.extend(range(offsets[-1] + 1, offsets[-1] + 1 + self.per_poll))
        return answer


def test_the_scan_takes_the_backlog_and_leaves_the_tail_written_meanwhile() -> None:
    # 3,000 records wait; 5 more arrive at every poll. Chasing them would run the scan until
    # the budget (20,000 records, 3,400 polls); the tail is the next trigger's.
    log = GrowingLog({A0: list(range(3000))}, per_poll=5)
    end = scanning_reader(log).latestOffset({}, ReadMaxRows(20_000))
    assert 3000 <= positions_of(end)["ta"]["0"] <= 3010, end
    # Given time to follow the tail (the fake's polls take none), it follows it to the budget.
    patient = GrowingLog({A0: list(range(3000))}, per_poll=5)
    followed = scanning_reader(patient, tail_seconds=30.0).latestOffset({}, ReadMaxRows(20_000))
    assert positions_of(followed)["ta"]["0"] >= 19_000, followed
    # A backlog bigger than a poll's 5,000 records is read poll after poll, up to the budget.
    big = GrowingLog({A0: list(range(12_000))}, per_poll=5)
    assert positions_of(scanning_reader(big).latestOffset({}, ReadMaxRows(20_000)))["ta"][
        "0"
    ] in range(12_000, 12_021)
    # Without a budget (Trigger.AvailableNow) the scan reads to where the records stop.
    settled = FakeLog({A0: list(range(3000))})
    assert positions_of(scanning_reader(settled).latestOffset({}, ReadAllAvailable())) == {
        "ta": {"0": 3000}
    }


def read_all(reader: _KafkaStreamReader, log: FakeLog, start: int, end: int) -> list[int]:
    import outbox_lake.kafka_source as source

    source._WORKER_CONSUMERS["unused:1"] = log
    try:
        batches = reader.read(source._Range("ta", 0, start, end))
        return [offset for batch in batches for offset in batch.column("offset").to_pylist()]
    finally:
        source._WORKER_CONSUMERS.pop("unused:1", None)


def test_read_never_jumps_a_gap_retention_made_under_the_batch() -> None:
    log = FakeLog({A0: list(range(5, 20))})  # 0-4 deleted after the batch was planned
    with pytest.raises(DataLossError, match=r"ta\[0\]: offsets 0 to 4 were deleted by retention"):
        read_all(scanning_reader(log), log, 0, 10)
    log = FakeLog({A0: list(range(5, 20))})
    assert read_all(scanning_reader(log, fail_on_data_loss=False), log, 0, 10) == [5, 6, 7, 8, 9]
    markers = FakeLog({A0: [0, 1, 3, 4]})  # offset 2 holds no record (a transaction marker)
    assert read_all(scanning_reader(markers), markers, 0, 5) == [0, 1, 3, 4]


def test_read_reports_an_offset_out_of_range_as_data_loss() -> None:
    log = FakeLog({A0: [0, 1, 2]}, out_of_range=True)  # recreated: the range 8-12 is beyond it
    with pytest.raises(DataLossError, match="out of range though the partition starts at 0"):
        read_all(scanning_reader(log), log, 8, 12)
    log = FakeLog({A0: [0, 1, 2]}, out_of_range=True)
    assert read_all(scanning_reader(log, fail_on_data_loss=False), log, 8, 12) == []


def test_read_parses_while_it_reads_when_asked() -> None:
    import outbox_lake.kafka_source as source

    log = FakeLog({A0: [0, 1]})
    reader = scanning_reader(log)
    reader.parse = True
    source._WORKER_CONSUMERS["unused:1"] = log
    try:
        (batch,) = list(reader.read(source._Range("ta", 0, 0, 2)))
    finally:
        source._WORKER_CONSUMERS.pop("unused:1", None)
    assert batch.schema.names[0] == "kind" and "position" in batch.schema.names
    assert batch.column("kind").to_pylist() == ["quarantine", "quarantine"]  # not outbox topics
    assert "not an outbox topic" in batch.column("reason").to_pylist()[0]
