"""The demo's report, queried from the lake: orders per status, events per type, and the
commit-to-queryable latency of the orders' events (``outbox demo`` prints it).

Every query reads the ``events`` table through :func:`outbox_lake.query.run_sql` (DuckDB over Arrow,
no Spark) and counts only one run's rows: events of one aggregate type whose ``event_time``
(the UUIDv7 event id's time, i.e. the commit) is at or after ``since``, so earlier runs on
the same lake do not change the figures. Values are bound as parameters, never formatted
into the SQL. A lake without an ``events`` table yet counts 0 (the job has not committed).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from outbox_lake.query import run_sql
from outbox_lake.settings import LakeSettings

__all__ = ["OrderReport", "count_event", "count_events_since", "order_report"]

_THIS_RUN = "aggregate_type = ? AND event_time >= to_timestamp(?)"


@dataclass(frozen=True)
class OrderReport:
    by_status: list[tuple[str, int]]
    """(status, orders): ``paid`` when one of the order's events is ``OrderPaid``."""
    by_type: list[tuple[str, int]]
    """(event type, events)."""
    latency_p50: float | None
    """Seconds from commit (event id time) to lake ingest time; None without events."""
    latency_p95: float | None


def _count(settings: LakeSettings, sql: str, params: list[Any]) -> int:
    import duckdb

    try:
        _, rows = run_sql(settings, sql, params)
    except duckdb.CatalogException:
        return 0  # no events table yet
    return int(rows[0][0])


def count_events_since(settings: LakeSettings, aggregate_type: str, since: float) -> int:
    """Events of ``aggregate_type`` committed at or after ``since`` (Unix seconds)."""
    return _count(
        settings,
        f"SELECT count(*) FROM events WHERE {_THIS_RUN}",  # noqa: S608
        [aggregate_type, since],
    )


def count_event(settings: LakeSettings, event_id: str) -> int:
    """1 when the event is in the lake (its ``events`` row), else 0."""
    return _count(settings, "SELECT count(*) FROM events WHERE event_id = ?", [event_id])


def order_report(
    settings: LakeSettings, since: float, aggregate_type: str = "order"
) -> OrderReport:
    """The report over the orders' events committed at or after ``since``."""
    params: list[Any] = [aggregate_type, since]
    _, by_type = run_sql(
        settings,
        f"SELECT event_type, count(*) FROM events WHERE {_THIS_RUN} "  # noqa: S608
        "GROUP BY 1 ORDER BY 1",
        params,
    )
    _, by_status = run_sql(
        settings,
        "SELECT status, count(*) FROM (SELECT aggregate_id, "  # noqa: S608
        "CASE WHEN bool_or(event_type = 'OrderPaid') THEN 'paid' ELSE 'placed' END AS status "
        f"FROM events WHERE {_THIS_RUN} GROUP BY 1) GROUP BY 1 ORDER BY 1",
        params,
    )
    _, latency = run_sql(
        settings,
        "SELECT quantile_cont(s, 0.5), quantile_cont(s, 0.95) FROM (SELECT "  # noqa: S608
        f"epoch(ingest_time) - epoch(event_time) AS s FROM events WHERE {_THIS_RUN})",
        params,
    )
    p50, p95 = latency[0] if latency else (None, None)
    return OrderReport(
        by_status=[(str(status), int(count)) for status, count in by_status],
        by_type=[(str(event_type), int(count)) for event_type, count in by_type],
        latency_p50=None if p50 is None else float(p50),
        latency_p95=None if p95 is None else float(p95),
    )
