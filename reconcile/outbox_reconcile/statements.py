"""The SQL reconcile and trace run on the outbox's database, as text (pure).

Every name comes from :class:`outbox.core.tables.OutboxTables`, validated and quoted there.
All of it only reads.
"""

from __future__ import annotations

from dataclasses import dataclass

from outbox.core.tables import OutboxTables

__all__ = ["ReconcileStatements"]


@dataclass(frozen=True)
class ReconcileStatements:
    tables: OutboxTables

    @property
    def outbox_rows(self) -> str:
        """Every present row: id, aggregate, position, age in seconds."""
        return (
            "SELECT id::text, aggregatetype, aggregateid, position, "
            "extract(epoch FROM clock_timestamp() - created_at)::float8 "
            f"FROM {self.tables.qualified_outbox}"
        )

    @property
    def dead_letters(self) -> str:
        return (
            "SELECT id::text, aggregatetype, aggregateid, position, reason, failed_at::text "
            f"FROM {self.tables.qualified_dead_letter}"
        )

    @property
    def slots(self) -> str:
        """The WAL each logical slot of this database retains, in bytes (slot lag)."""
        return (
            "SELECT slot_name::text, "
            "coalesce(pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn), 0)::bigint "
            "FROM pg_replication_slots WHERE database = current_database() "
            "AND slot_type = 'logical' ORDER BY slot_name"
        )

    @property
    def outbox_row(self) -> str:
        """One row by id (``%s``): aggregate, type, position, created_at, age, traceparent."""
        return (
            "SELECT aggregatetype, aggregateid, type, position, created_at, "
            "extract(epoch FROM clock_timestamp() - created_at)::float8, traceparent "
            f"FROM {self.tables.qualified_outbox} WHERE id = %s::uuid"
        )

    @property
    def dead_letter(self) -> str:
        """One dead letter by id (``%s``)."""
        return (
            "SELECT aggregatetype, aggregateid, type, position, created_at, reason, failed_at "
            f"FROM {self.tables.qualified_dead_letter} WHERE id = %s::uuid"
        )
