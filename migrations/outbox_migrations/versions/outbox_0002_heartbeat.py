"""Heartbeat table for CDC: lets the connector confirm its slot while the outbox is idle.

Revision ID: outbox_0002
Revises: outbox_0001
Create Date: 2026-11-23
"""

from __future__ import annotations

from alembic import op

from outbox_migrations.names import outbox_tables

revision = "outbox_0002"
down_revision = "outbox_0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    tables = outbox_tables()
    op.execute(
        f"CREATE TABLE {tables.qualified_heartbeat} ("
        "id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, "
        "beat timestamptz NOT NULL DEFAULT clock_timestamp())"
    )
    # Inserts only, like the outbox: the connector sees each beat and moves its slot on.
    op.execute(
        f"ALTER PUBLICATION {tables.quoted_publication} ADD TABLE {tables.qualified_heartbeat}"
    )


def downgrade() -> None:
    tables = outbox_tables()
    op.execute(
        f"ALTER PUBLICATION {tables.quoted_publication} DROP TABLE {tables.qualified_heartbeat}"
    )
    op.execute(f"DROP TABLE {tables.qualified_heartbeat}")
