"""Progress kept in the lake's own commits: one Delta application transaction per topic-partition.

Every commit the sink makes carries, for each Kafka topic-partition of its batch, a ``txn``
action ``(outbox-lake:<topic>:<partition>, version)`` whose version is the offset after the
last record of that partition the table has taken in (as kafka-delta-ingest does). It is
never used to *skip* anything: every write is an insert-only merge keyed by the event id (or
the quarantine id), so a replayed batch, a deleted checkpoint, a renamed query or a restored
backup re-reads records and lands only what is new. It serves to see how far each table has
come (``outbox lake tables``, lineage) and to tell when a checkpoint is behind the lake.

Versions only move forward: a batch re-read after a checkpoint reset does not lower them.
"""

from __future__ import annotations

from typing import Any

from deltalake import DeltaTable, Transaction

__all__ = ["APP_PREFIX", "app_id", "batch_ends", "forward_transactions"]

APP_PREFIX = "outbox-lake"

Ends = dict[tuple[str, int], int]
"""{(topic, partition): offset after the batch's last record of that partition}"""


def app_id(topic: str, partition: int) -> str:
    return f"{APP_PREFIX}:{topic}:{partition}"


def batch_ends(rows: Any) -> Ends:
    """The end offset per topic-partition of a parsed batch (an Arrow table of any kind)."""
    ends: Ends = {}
    if rows is None or rows.num_rows == 0:
        return ends
    for topic, partition, offset in zip(
        rows.column("topic").to_pylist(),
        rows.column("partition").to_pylist(),
        rows.column("offset").to_pylist(),
        strict=True,
    ):
        key = (topic, partition)
        ends[key] = max(ends.get(key, 0), offset + 1)
    return ends


def forward_transactions(table: DeltaTable | None, ends: Ends) -> list[Transaction]:
    """The ``txn`` actions that move ``table``'s progress forward (none that would lower it)."""
    actions = []
    for (topic, partition), end in sorted(ends.items()):
        known = None if table is None else table.transaction_version(app_id(topic, partition))
        if known is None or int(known) < end:
            actions.append(Transaction(app_id(topic, partition), end))
    return actions
