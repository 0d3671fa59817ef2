"""The comparison: what reconcile reports, computed as SQL over :class:`Evidence`. (Pure.)

Each finding is a promise broken (or not provably kept); each figure is context. A finding
is counted per aggregate type and keeps at most ``examples`` examples per aggregate type, so
the report's size does not grow with the data.

Rules that keep a healthy pipeline free of findings while it runs:

- an outbox row is *stuck* only when it is older than ``stuck_after_seconds`` and its event
  is not on Kafka (a younger one is in flight; one on Kafka is delivered, awaiting deletion);
- an event on Kafka is *missing from the lake* only when the lake's ``events`` table has
  taken in its offset (the sink's per-partition progress) and neither has the event nor
  quarantined that record; above the progress it is *pending ingest* (a figure);
- a lake row is *not on Kafka* only when its offset lies in the range reconcile read from its
  partition (below: deleted by retention; above: landed after reconcile read Kafka);
- per-aggregate order is judged on each event's first copy (duplicates from a replay or a
  path switch repeat earlier events and are allowed on Kafka), in offset order: a position
  lower than one already seen for the same aggregate is a violation.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

from outbox_reconcile.evidence import Evidence

__all__ = ["FINDING_KINDS", "Finding", "Report", "compare"]

FINDING_KINDS: dict[str, str] = {
    "outbox_stuck": "outbox row older than the stuck threshold whose event is not on Kafka",
    "dead_letter": "event the relay could not publish (in the dead-letter table)",
    "missing_in_lake": "event on Kafka, taken in by the lake, but not in the events table",
    "duplicate_in_lake": "event id more than once in the events table",
    "duplicate_in_typed_table": "event id more than once in its typed table",
    "not_on_kafka": "lake row whose event id never appeared on Kafka",
    "kafka_order_violation": "record on Kafka with a lower position than an earlier record "
    "of the same aggregate",
    "lake_order_violation": "lake row with a lower position than a row of the same "
    "aggregate at a lower offset",
    "position_mismatch": "lake row whose position differs from its record's on Kafka",
    "typed_row_missing": "event in events with neither a typed row nor a quarantine row",
    "quarantined": "records or typed rows the lake set aside, by reason",
    "conflicting_copies": "event id on Kafka in copies with different content (an id reused "
    "or forged): never duplicates; the lake keeps the first written and sets the rest aside",
    "kafka_undecodable": "record on Kafka that no reader can take at its word (a header "
    "name that is not UTF-8): consumers dead-letter it, the relay confirms nothing by it",
}


@dataclass
class Finding:
    kind: str
    aggregate_type: str
    count: int = 0
    examples: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class Report:
    window: str
    findings: list[Finding]
    figures: dict[str, int]
    slots: dict[str, int] = field(default_factory=dict)
    """WAL retained per logical replication slot of the outbox's database (bytes)."""

    @property
    def finding_count(self) -> int:
        return sum(finding.count for finding in self.findings)

    @property
    def exit_code(self) -> int:
        """0: nothing found; 1: at least one finding."""
        return 1 if self.findings else 0

    def by_aggregate_type(self) -> dict[str, dict[str, int]]:
        summary: dict[str, dict[str, int]] = {}
        for finding in self.findings:
            summary.setdefault(finding.aggregate_type, {})[finding.kind] = finding.count
        return summary

    def to_dict(self) -> dict[str, Any]:
        return {
            "window": self.window,
            "clean": not self.findings,
            "finding_count": self.finding_count,
            "by_aggregate_type": self.by_aggregate_type(),
            "findings": [asdict(finding) for finding in self.findings],
            "figures": self.figures,
            "slot_retained_wal_bytes": self.slots,
        }


_KAFKA_ORDER = """
SELECT aggregate_type, event_id, aggregate_id, position, before, topic, partition, "offset"
FROM (SELECT *, max(position) OVER (
        PARTITION BY aggregate_type, aggregate_id ORDER BY topic, partition, "offset"
        ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS before
      FROM {table} WHERE position IS NOT NULL)
WHERE position < before
"""

_QUERIES: dict[str, tuple[str, tuple[str, ...]]] = {
    "outbox_stuck": (
        """SELECT aggregate_type, event_id, aggregate_id, position, age_seconds
        FROM outbox_rows o WHERE age_seconds >= ?
        AND NOT EXISTS (SELECT 1 FROM kafka_first k WHERE k.event_id = o.event_id)
        ORDER BY position""",
        ("event_id", "aggregate_id", "position", "age_seconds"),
    ),
    "dead_letter": (
        """SELECT aggregate_type, event_id, aggregate_id, position, reason, failed_at
        FROM dead_letters ORDER BY position""",
        ("event_id", "aggregate_id", "position", "reason", "failed_at"),
    ),
    "missing_in_lake": (
        """SELECT k.aggregate_type, k.event_id, k.aggregate_id, k.position, k.topic,
                  k.partition, k."offset"
        FROM kafka_first k JOIN lake_progress p ON p.topic = k.topic
             AND p.partition = k.partition AND k."offset" < p."end"
        WHERE NOT EXISTS (SELECT 1 FROM lake_first l WHERE l.event_id = k.event_id)
        AND NOT EXISTS (SELECT 1 FROM kafka c JOIN quarantine q ON q.topic = c.topic
                        AND q.partition = c.partition AND q."offset" = c."offset"
                        WHERE c.event_id = k.event_id)
        ORDER BY k.topic, k.partition, k."offset\"""",
        ("event_id", "aggregate_id", "position", "topic", "partition", "offset"),
    ),
    "conflicting_copies": (
        """SELECT f.aggregate_type, k.event_id, count(DISTINCT k.digest), count(*),
                  group_concat(k.topic || '[' || k.partition || ']@' || k."offset", ' ')
        FROM kafka k JOIN kafka_first f ON f.event_id = k.event_id
        WHERE k.digest IS NOT NULL
        GROUP BY k.event_id HAVING count(DISTINCT k.digest) > 1 ORDER BY k.event_id""",
        ("event_id", "contents", "copies", "read_at"),
    ),
    "duplicate_in_lake": (
        """SELECT aggregate_type, event_id, aggregate_id, copies FROM lake_first
        WHERE copies > 1 ORDER BY event_id""",
        ("event_id", "aggregate_id", "rows"),
    ),
    "duplicate_in_typed_table": (
        """SELECT aggregate_type, event_id, typed_table, count(*) FROM typed
        GROUP BY typed_table, event_id HAVING count(*) > 1 ORDER BY event_id""",
        ("event_id", "typed_table", "rows"),
    ),
    "not_on_kafka": (
        """SELECT l.aggregate_type, l.event_id, l.aggregate_id, l.position, l.topic,
                  l.partition, l."offset"
        FROM lake_first l LEFT JOIN kafka_ranges r ON r.topic = l.topic
             AND r.partition = l.partition
        WHERE (r.topic IS NULL OR (l."offset" >= r.start AND l."offset" < r."end"))
        AND NOT EXISTS (SELECT 1 FROM kafka_first k WHERE k.event_id = l.event_id)
        ORDER BY l.topic, l.partition, l."offset\"""",
        ("event_id", "aggregate_id", "position", "topic", "partition", "offset"),
    ),
    "kafka_order_violation": (
        _KAFKA_ORDER.format(table="kafka_first"),
        ("event_id", "aggregate_id", "position", "after_position", "topic", "partition", "offset"),
    ),
    "lake_order_violation": (
        _KAFKA_ORDER.format(table="lake_first"),
        ("event_id", "aggregate_id", "position", "after_position", "topic", "partition", "offset"),
    ),
    "position_mismatch": (
        """SELECT l.aggregate_type, l.event_id, l.aggregate_id, l.position, k.position
        FROM lake_first l JOIN kafka_first k ON k.event_id = l.event_id
        WHERE l.position IS NOT k.position ORDER BY l.event_id""",
        ("event_id", "aggregate_id", "lake_position", "kafka_position"),
    ),
    "typed_row_missing": (
        """SELECT l.aggregate_type, l.event_id, l.aggregate_id, l.typed_table FROM lake_first l
        WHERE l.typed_table IS NOT NULL
        AND NOT EXISTS (SELECT 1 FROM typed t WHERE t.typed_table = l.typed_table
                        AND t.event_id = l.event_id)
        AND NOT EXISTS (SELECT 1 FROM quarantine q WHERE q.target_table = l.typed_table
                        AND q.event_id = l.event_id)
        ORDER BY l.event_id""",
        ("event_id", "aggregate_id", "typed_table"),
    ),
    "kafka_undecodable": (
        """SELECT aggregate_type, topic, partition, "offset", reason FROM undecodable
        ORDER BY topic, partition, "offset\"""",
        ("topic", "partition", "offset", "reason"),
    ),
}

_QUARANTINED = """SELECT aggregate_type, target_table, reason, count(*) FROM quarantine
WHERE in_window GROUP BY aggregate_type, target_table, reason ORDER BY count(*) DESC"""

_FIGURES: dict[str, str] = {
    "outbox_rows": "SELECT count(*) FROM outbox_rows",
    "outbox_rows_in_flight": """SELECT count(*) FROM outbox_rows o WHERE age_seconds < ?
        AND NOT EXISTS (SELECT 1 FROM kafka_first k WHERE k.event_id = o.event_id)""",
    "outbox_rows_delivered_not_deleted": """SELECT count(*) FROM outbox_rows o
        WHERE EXISTS (SELECT 1 FROM kafka_first k WHERE k.event_id = o.event_id)""",
    "dead_letters": "SELECT count(*) FROM dead_letters",
    "kafka_partitions": "SELECT count(*) FROM kafka_ranges",
    "kafka_records": "SELECT count(*) FROM kafka",
    "kafka_events": "SELECT count(*) FROM kafka_first",
    "kafka_duplicate_copies": """SELECT count(*) - count(DISTINCT event_id || '/' ||
        coalesce(digest, '')) FROM kafka""",
    "kafka_malformed_records": "SELECT count(*) FROM malformed",
    "kafka_undecodable_records": "SELECT count(*) FROM undecodable",
    "lake_rows": "SELECT count(*) FROM lake",
    "lake_events": "SELECT count(*) FROM lake_first",
    "lake_pending_ingest": """SELECT count(*) FROM kafka_first k
        WHERE NOT EXISTS (SELECT 1 FROM lake_first l WHERE l.event_id = k.event_id)
        AND k."offset" >= coalesce((SELECT p."end" FROM lake_progress p
                                    WHERE p.topic = k.topic AND p.partition = k.partition), 0)""",
    "lake_rows_beyond_kafka_read": """SELECT count(*) FROM lake_first l JOIN kafka_ranges r
        ON r.topic = l.topic AND r.partition = l.partition
        WHERE (l."offset" < r.start OR l."offset" >= r."end")
        AND NOT EXISTS (SELECT 1 FROM kafka_first k WHERE k.event_id = l.event_id)""",
    "typed_rows": "SELECT count(*) FROM typed",
    "quarantine_rows": "SELECT count(*) FROM quarantine WHERE in_window",
}


def _grouped(
    rows: Iterator[tuple[Any, ...]], kind: str, names: tuple[str, ...], examples: int
) -> list[Finding]:
    found: dict[str, Finding] = {}
    for aggregate_type, *values in rows:
        finding = found.setdefault(aggregate_type, Finding(kind, aggregate_type))
        finding.count += 1
        if len(finding.examples) < examples:
            finding.examples.append(dict(zip(names, values, strict=True)))
    return list(found.values())


def compare(
    evidence: Evidence,
    *,
    window: str = "all events",
    stuck_after_seconds: float = 60.0,
    examples: int = 20,
) -> Report:
    """Every finding and figure of what ``evidence`` holds."""
    findings: list[Finding] = []
    for kind, (sql, names) in _QUERIES.items():
        parameters = (stuck_after_seconds,) if "?" in sql else ()
        findings += _grouped(iter(evidence.query(sql, parameters)), kind, names, examples)
    quarantined: dict[str, Finding] = {}
    for aggregate_type, target_table, reason, count in evidence.query(_QUARANTINED):
        finding = quarantined.setdefault(aggregate_type, Finding("quarantined", aggregate_type))
        finding.count += count
        if len(finding.examples) < examples:
            finding.examples.append({"target_table": target_table, "reason": reason, "rows": count})
    findings += quarantined.values()
    figures = {
        name: evidence.scalar(sql, (stuck_after_seconds,) if "?" in sql else ())
        for name, sql in _FIGURES.items()
    }
    findings.sort(key=lambda finding: (finding.aggregate_type, finding.kind))
    return Report(window=window, findings=findings, figures=figures)
