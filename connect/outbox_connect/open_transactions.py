"""Transactions left open on Kafka Connect's offsets topic, and aborting the hanging ones.

With exactly-once source support on, a Connect worker reads its offsets topic
``read_committed`` to its end before it starts (and each exactly-once task does, before
its first poll). A transaction open on that topic holds every such read at its first
record: the worker answers REST but starts no connector, a task never polls. A transaction
whose producer died is normally aborted by its coordinator once its timeout has passed (a
minute for Connect's task producers); one its coordinator no longer counts as open on that
partition (a *hanging* transaction, KIP-664: its coordinator finished it, or never knew the
partition was in it) is never ended by Kafka itself, and holds the worker until an operator
aborts it. This module finds both kinds, through the partition leaders' producer state and
the coordinators' own view, and aborts the hanging ones only: the coordinator of any other
may still commit it, and an abort written beside it could hide records it commits.

Aborting a hanging transaction loses nothing: the task starts again from the last source
offsets its readers see committed, and Debezium re-reads the WAL from there. What it may do
is re-deliver: a restarted broker's coordinator can record a transaction as committed
(``CompleteCommit``) before its marker reached the offsets partition (a leader it could not
find yet); aborting that one hides offsets whose records were delivered, so they are
delivered again (duplicates, which the lake and an idempotent consumer drop). Each hanging
transaction says which it is (:attr:`OpenTransaction.coordinator_outcome`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from outbox.core.errors import BrokerError, BrokerUnavailable
from outbox.kafka_clients import kafka_errors, open_client
from outbox.kafka_options import client_options
from outbox.settings import KafkaSettings

__all__ = [
    "IDLE_SECONDS",
    "OpenTransaction",
    "abort_hanging",
    "open_transactions",
    "unblock",
]

IDLE_SECONDS = 60.0
"""How long a hanging transaction's producer must have been silent before it is aborted, by
default: a margin for a coordinator that is just recording a new partition."""

_COORDINATOR_OPEN = {"Ongoing", "PrepareCommit", "PrepareAbort", "PrepareEpochFence"}
"""Coordinator states in which the coordinator itself will end the transaction."""

UNLISTED_IDLE_SECONDS = 15 * 60.0
"""A producer no coordinator lists at all may belong to a coordinator that is moving or
loading: aborted only once silent this long (Kafka's default ``transaction.max.timeout.ms``,
past which any coordinator has ended its own transactions), as Kafka's own tool does."""


@dataclass(frozen=True)
class OpenTransaction:
    """A transaction open on one partition: who opened it, where it starts, how long its
    producer has been silent there, and what its coordinator makes of it
    (``coordinator_state`` ``None``: no coordinator counts it as open on this partition)."""

    topic: str
    partition: int
    producer_id: int
    producer_epoch: int
    coordinator_epoch: int
    first_offset: int
    idle_seconds: float
    transactional_id: str | None
    coordinator_state: str | None
    listed: bool = True
    """A coordinator lists the producer (in whatever state): it knows it."""
    coordinator_outcome: str | None = None
    """For a hanging one: the state its transactional id's coordinator is in now
    (``CompleteCommit``: it committed, the marker never came; ``CompleteAbort``, ``Empty``,
    a newer transaction's state, or None when no coordinator knows the producer)."""

    @property
    def hanging(self) -> bool:
        """Kafka will never end it: only an abort from an operator will."""
        return self.coordinator_state is None

    def silence_needed(self, idle_seconds: float) -> float:
        """How long its producer must have been silent before it may be aborted:
        ``idle_seconds``, or :data:`UNLISTED_IDLE_SECONDS` at least if no coordinator lists
        the producer."""
        return idle_seconds if self.listed else max(idle_seconds, UNLISTED_IDLE_SECONDS)

    @property
    def abort_redelivers(self) -> bool:
        """Aborting it hides offsets of records already delivered: the task delivers them
        again (duplicates downstream drop; nothing is lost)."""
        return self.hanging and self.coordinator_outcome == "CompleteCommit"

    def abort_effect(self) -> str:
        """What aborting it does, in words."""
        if self.abort_redelivers:
            return (
                "its coordinator recorded it committed, the marker never reached this "
                "partition: aborting re-delivers its records (duplicates, which the lake and "
                "idempotent consumers drop), loses nothing"
            )
        return "it never committed: aborting loses nothing and re-delivers nothing"

    def describe(self) -> str:
        owner = self.transactional_id or "a producer no coordinator knows"
        state = (
            f"hanging (no coordinator counts it open: Kafka never ends it; {self.abort_effect()})"
            if self.hanging
            else f"its coordinator has it {self.coordinator_state} and ends it itself"
        )
        return (
            f"{self.topic}[{self.partition}]: transaction of producer {self.producer_id} "
            f"(epoch {self.producer_epoch}, {owner}) open from offset {self.first_offset}, "
            f"silent {self.idle_seconds:.0f} s: {state}"
        )


def _admin(settings: KafkaSettings) -> Any:
    from kafka import KafkaAdminClient

    return open_client(
        settings, KafkaAdminClient, client_options(settings, client_id="outbox-connect-check")
    )


def open_transactions(settings: KafkaSettings, topic: str) -> list[OpenTransaction]:
    """Every transaction open on ``topic`` (each of its partitions), with its coordinator's
    view; an empty list when none is."""
    from kafka import TopicPartition

    admin = _admin(settings)
    try:
        with kafka_errors(settings):
            (described_topic,) = admin.describe_topics([topic])
            if described_topic["error_code"]:
                raise BrokerError(
                    f"topic {topic} cannot be described (error {described_topic['error_code']}"
                    "): is it Connect's offsets topic? (OUTBOX_CONNECT_OFFSETS_TOPIC)"
                )
            partitions = described_topic["partitions"]
            producers = admin.describe_producers(
                [TopicPartition(topic, p["partition_index"]) for p in partitions]
            )
            now_ms = time.time() * 1000
            opened = [
                (tp, producer)
                for tp, state in producers.items()
                for producer in state.active_producers
                if producer.current_transaction_start_offset >= 0
            ]
            if not opened:
                return []
            listed = admin.list_transactions(
                producer_id_filters=sorted({p.producer_id for _, p in opened})
            )
            ids: dict[int, set[str]] = {}
            for listings in listed.values():
                for listing in listings:
                    ids.setdefault(listing.producer_id, set()).add(listing.transactional_id)
            wanted = sorted(set().union(*ids.values())) if ids else []
            described = admin.describe_transactions(wanted) if wanted else {}
    finally:
        admin.close()
    found = []
    for tp, producer in opened:
        names = sorted(ids.get(producer.producer_id, ()))
        coordinator_state = None
        outcome = None
        for name in names:  # open if any coordinator has it open on this partition
            view = described.get(name)
            if view is None or view.producer_id != producer.producer_id:
                continue
            outcome = str(view.state.value)
            if outcome in _COORDINATOR_OPEN and tp in view.topic_partitions:
                coordinator_state = outcome
        found.append(
            OpenTransaction(
                topic=tp.topic,
                partition=tp.partition,
                producer_id=producer.producer_id,
                producer_epoch=producer.producer_epoch,
                coordinator_epoch=producer.coordinator_epoch,
                first_offset=producer.current_transaction_start_offset,
                idle_seconds=max(0.0, (now_ms - producer.last_timestamp) / 1000),
                transactional_id=names[0] if names else None,
                coordinator_state=coordinator_state,
                listed=bool(names),
                coordinator_outcome=None if coordinator_state else outcome,
            )
        )
    return sorted(found, key=lambda t: (t.partition, t.first_offset))


def abort_hanging(
    settings: KafkaSettings, transactions: list[OpenTransaction], *, idle_seconds: float
) -> list[OpenTransaction]:
    """Abort each of ``transactions`` that is hanging and whose producer has been silent on
    its partition for ``idle_seconds`` at least (a margin for a coordinator that is just
    recording a new partition; :data:`UNLISTED_IDLE_SECONDS` at least for a producer no
    coordinator lists); returns those aborted. Nothing is aborted while a partition of the
    coordinators' own log (``__transaction_state``) has no leader: a coordinator that is not
    loaded lists nothing. The partition's leader checks the producer id and epoch before it
    writes the abort marker."""
    from kafka import TopicPartition
    from kafka.admin import AbortTransactionSpec

    chosen = [
        t for t in transactions if t.hanging and t.idle_seconds >= t.silence_needed(idle_seconds)
    ]
    if not chosen:
        return []
    admin = _admin(settings)
    try:
        with kafka_errors(settings):
            (log,) = admin.describe_topics(["__transaction_state"])
            leaderless = [p for p in log["partitions"] if p["error_code"] or p["leader_id"] < 0]
            if log["error_code"] or leaderless:
                raise BrokerUnavailable(
                    "the transaction coordinators' log (__transaction_state) has partitions "
                    "without a leader: not aborting anything while a coordinator may be "
                    "loading; run again once the cluster is whole"
                )
            for transaction in chosen:
                admin.abort_transaction(
                    AbortTransactionSpec(
                        topic_partition=TopicPartition(transaction.topic, transaction.partition),
                        producer_id=transaction.producer_id,
                        producer_epoch=transaction.producer_epoch,
                        coordinator_epoch=transaction.coordinator_epoch,
                    )
                )
    finally:
        admin.close()
    return chosen


def unblock(
    settings: KafkaSettings, topic: str, *, idle_seconds: float
) -> tuple[list[OpenTransaction], list[OpenTransaction]]:
    """Abort the hanging transactions on ``topic`` silent for ``idle_seconds`` at least
    (:func:`abort_hanging`); returns those aborted, and those still open after (each
    described by :meth:`OpenTransaction.describe`)."""
    found = open_transactions(settings, topic)
    aborted = abort_hanging(settings, found, idle_seconds=idle_seconds)
    return aborted, (open_transactions(settings, topic) if aborted else found)
