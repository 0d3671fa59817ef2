"""Retention: delete what the outbox's tables keep beyond its use, in one transaction.

Run it on a schedule (``outbox db expire``, e.g. hourly) as the owner of the outbox objects:

- dedup keys older than ``OUTBOX_DEDUP_WINDOW`` (24 h): a key past its window no longer
  deduplicates anything;
- inbox claims older than ``OUTBOX_INBOX_RETENTION`` (7 days): keep it longer than any
  redelivery can take (a record redelivered after its claim is gone is applied again);
- consumers' dead letters older than ``OUTBOX_DEAD_LETTER_RETENTION`` (30 days by default;
  ``dead_letters`` overrides it): look at them before, once expired they are gone. **Not the
  relay's dead letters**: those are committed events that were never published, kept until
  replayed (``outbox relay dead-letters retry``) or discarded by id (``outbox relay
  dead-letters discard ID... --yes``);
- side-effect steps *done* longer ago than the longer of ``OUTBOX_INBOX_RETENTION`` and the
  dead letters' retention (a redelivery, or a dead letter's replay, must still find them
  done), and never one whose event still has a consumer dead letter; started and parked
  steps are never deleted;
- heartbeat rows older than an hour (the connector's heartbeat query deletes them as well;
  this covers a connector that was removed).

Delivered outbox rows are deleted by the relay (``polling``, ``auto``, or ``cleanup`` mode
beside CDC). Each deletion uses an index on its time column, except the ledger's done steps
(a scan of that table). The relay's ``outbox_table_rows_estimate{table}`` metric shows each
table's size.
"""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import text
from sqlalchemy.engine import Connection

from outbox.core.effect_statements import EffectStatements
from outbox.settings import OutboxSettings, effect_retention

__all__ = ["HEARTBEAT_RETENTION", "expire"]

HEARTBEAT_RETENTION = timedelta(hours=1)


def expire(
    connection: Connection,
    *,
    settings: OutboxSettings | None = None,
    dead_letters: timedelta | None = None,
) -> dict[str, int]:
    """Delete expired rows; returns how many per table (the caller commits).

    ``dead_letters`` overrides ``OUTBOX_DEAD_LETTER_RETENTION``; done ledger steps are then
    kept at least that long too.
    """
    settings = settings if settings is not None else OutboxSettings()
    tables = settings.tables
    if dead_letters is None:
        dead_letters = settings.dead_letter_retention
    plan = (
        (tables.dedup, tables.qualified_dedup, "created_at", settings.dedup_window),
        (tables.inbox, tables.qualified_inbox, "received_at", settings.inbox_retention),
        (tables.inbox_dead_letter, tables.qualified_inbox_dead_letter, "failed_at", dead_letters),
        (tables.heartbeat, tables.qualified_heartbeat, "beat", HEARTBEAT_RETENTION),
    )
    deleted: dict[str, int] = {}
    for name, qualified, column, older_than in plan:
        result = connection.execute(
            text(
                f"DELETE FROM {qualified} WHERE {column} < clock_timestamp() - "
                "make_interval(secs => :seconds)"
            ),
            {"seconds": older_than.total_seconds()},
        )
        deleted[name] = int(result.rowcount)
    # The side-effect ledger's done steps: its own statement (the one `delete_expired()` runs).
    result = connection.exec_driver_sql(
        EffectStatements(tables).delete_expired_done,
        {
            "window_seconds": effect_retention(
                settings.inbox_retention, dead_letters
            ).total_seconds()
        },
    )
    deleted[tables.effect] = int(result.rowcount)
    return deleted
