"""The chaos suite's own decisions, without services: its schedule covers every fault kind as
often as asked and replays from its seed, and its checks find each kind of violation (a
checker that cannot fail would pass every run)."""

from __future__ import annotations

import uuid
from collections import Counter
from itertools import pairwise

from chaos.schedule import RESOURCE, Kind, plan_faults
from chaos.truth import GroundTruth, Outcome, Written
from chaos.verify import LakeRow, check
from outbox_reconcile.records import KafkaCopy


def test_the_schedule_has_every_kind_as_often_as_asked_some_together_and_replays() -> None:
    plan = plan_faults(11, load_seconds=420, per_kind=2)
    assert Counter(fault.kind for fault in plan) == dict.fromkeys(Kind, 2)
    assert all(0.08 * 420 <= fault.at <= 0.8 * 420 + 3 for fault in plan)
    assert [fault.at for fault in plan] == sorted(fault.at for fault in plan)
    together = [
        (first, second)
        for first, second in pairwise(plan)
        if second.at - first.at <= 3 and RESOURCE[first.kind] != RESOURCE[second.kind]
    ]
    assert together, "no two faults planned at the same time"
    assert plan_faults(11, load_seconds=420, per_kind=2) == plan
    assert plan_faults(12, load_seconds=420, per_kind=2) != plan
    short = plan_faults(11, load_seconds=100, per_kind=1)
    assert Counter(fault.kind for fault in short) == dict.fromkeys(Kind, 1)


def test_the_broker_is_killed_as_well_as_paused_in_every_profile() -> None:
    for per_kind in (1, 2):
        kinds = Counter(f.kind for f in plan_faults(5, load_seconds=100, per_kind=per_kind))
        assert kinds[Kind.BROKER_KILL] == kinds[Kind.BROKER_PAUSE] == per_kind
    assert RESOURCE[Kind.BROKER_KILL] == RESOURCE[Kind.BROKER_PAUSE] == "broker"


class Pipeline:
    """A ground truth and what Kafka and the lake hold, written event by event."""

    def __init__(self) -> None:
        self.truth = GroundTruth()
        self.lake: list[LakeRow] = []
        self.kafka: list[KafkaCopy] = []
        self.positions = 0

    def written(self, aggregate_id: str = "a1", version: int | None = None) -> Written:
        self.positions += 1
        return Written(str(uuid.uuid4()), "account", aggregate_id, self.positions, version)

    def on_kafka(self, event: Written, position: int | None = None) -> None:
        self.kafka.append(
            KafkaCopy(
                event_id=event.event_id,
                aggregate_type=event.aggregate_type,
                aggregate_id=event.aggregate_id,
                position=event.position if position is None else position,
                topic="outbox.event.account",
                partition=0,
                offset=len(self.kafka),
                timestamp_ms=0,
            )
        )

    def in_lake(self, event: Written, position: int | None = None) -> None:
        copy = next(c for c in self.kafka if c.event_id == event.event_id)
        self.lake.append(
            LakeRow(
                event_id=event.event_id,
                aggregate_type=event.aggregate_type,
                aggregate_id=event.aggregate_id,
                position=copy.position if position is None else position,
                partition=copy.partition,
                offset=copy.offset,
            )
        )

    def delivered(
        self, outcome: Outcome = Outcome.COMMITTED, version: int | None = None
    ) -> Written:
        event = self.written(version=version)
        self.truth.record("writer", outcome, [event])
        self.on_kafka(event)
        self.in_lake(event)
        return event

    def counts(self) -> dict[str, int]:
        found = check(self.truth, self.lake, self.kafka)
        return {name: count for name, count in found.counts.items() if count}


def test_a_clean_pipeline_passes_with_duplicate_copies_on_kafka_and_unknown_outcomes() -> None:
    pipeline = Pipeline()
    first = pipeline.delivered(version=1)
    pipeline.delivered(version=2)
    pipeline.on_kafka(first)  # a relay's copy after a takeover: allowed
    pipeline.delivered(Outcome.UNKNOWN, version=3)  # it did commit
    pipeline.truth.record("writer", Outcome.UNKNOWN, [pipeline.written()])  # it did not
    pipeline.truth.record("writer", Outcome.ROLLED_BACK, [pipeline.written()])
    found = check(pipeline.truth, pipeline.lake, pipeline.kafka)
    assert found.clean, found.counts
    assert found.figures["unknown_landed"] == found.figures["unknown_absent"] == 1
    assert found.figures["kafka_duplicate_copies"] == 1


def test_the_checks_find_a_lost_event_and_an_unknown_one_seen_on_kafka_only() -> None:
    pipeline = Pipeline()
    lost = pipeline.written()
    pipeline.truth.record("writer", Outcome.COMMITTED, [lost])
    unknown = pipeline.written()
    pipeline.truth.record("writer", Outcome.UNKNOWN, [unknown])
    pipeline.on_kafka(unknown)  # so it committed, and must be in the lake
    assert pipeline.counts() == {"lost (committed, not in the lake)": 2}


def test_the_checks_find_a_duplicate_a_phantom_and_an_id_nobody_wrote() -> None:
    pipeline = Pipeline()
    twice = pipeline.delivered()
    pipeline.in_lake(twice)
    pipeline.delivered(Outcome.ROLLED_BACK)
    aborted = pipeline.written()
    pipeline.truth.record("writer", Outcome.ABORTED, [aborted])
    pipeline.on_kafka(aborted)
    pipeline.on_kafka(pipeline.written())  # in no writer's ground truth
    assert pipeline.counts() == {
        "duplicated in the lake": 1,
        "phantom (rolled back or aborted, yet seen)": 2,
        "never written, yet seen": 1,
    }


def test_the_checks_find_order_violations_and_a_position_not_the_commits() -> None:
    pipeline = Pipeline()
    early, late = pipeline.written(), pipeline.written()
    pipeline.truth.record("writer", Outcome.COMMITTED, [early, late])
    pipeline.on_kafka(late)
    pipeline.on_kafka(early)  # the later commit first: on Kafka and so in the lake
    pipeline.in_lake(late)
    pipeline.in_lake(early)
    other = pipeline.written()
    pipeline.truth.record("writer", Outcome.COMMITTED, [other])
    pipeline.on_kafka(other)
    pipeline.in_lake(other, position=999)  # not the position its transaction read back
    assert pipeline.counts() == {
        "order violations in the lake": 1,
        "order violations on Kafka": 1,
        "lake position differs from the commit's": 1,
    }


def test_the_ground_truth_itself_is_checked_versions_rise_with_positions() -> None:
    pipeline = Pipeline()
    pipeline.delivered(version=2)
    pipeline.delivered(version=1)  # committed later, yet an older version of the row
    assert pipeline.counts() == {"ground truth: versions out of position order": 1}
