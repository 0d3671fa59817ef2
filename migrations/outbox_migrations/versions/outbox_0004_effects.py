"""The side-effect ledger: one row per step (consumer, event id, effect) of a consumer.

A step is committed as ``started`` before its call to a third party and marked ``done``
with the third party's reference after it; a step cut short is ``needs_decision`` until an
operator decides, or ``released`` for one more attempt (outbox/core/effects.py). Parked
steps are listed oldest first, so they have an index of their own.

Revision ID: outbox_0004
Revises: outbox_0003
Create Date: 2026-11-23
"""

from __future__ import annotations

from alembic import op

from outbox.core.identifiers import quote_identifier
from outbox_migrations.names import outbox_tables

revision = "outbox_0004"
down_revision = "outbox_0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    tables = outbox_tables()
    op.execute(
        f"""
        CREATE TABLE {tables.qualified_effect} (
            consumer        text        NOT NULL,
            event_id        text        NOT NULL,
            effect          text        NOT NULL,
            idempotency_key uuid        NOT NULL,
            state           text        NOT NULL CHECK (
                state IN ('started', 'done', 'needs_decision', 'released')
            ),
            attempt         integer     NOT NULL CHECK (attempt > 0),
            reference       text,
            reason          text,
            context         jsonb       NOT NULL,
            started_at      timestamptz NOT NULL DEFAULT clock_timestamp(),
            updated_at      timestamptz NOT NULL DEFAULT clock_timestamp(),
            PRIMARY KEY (consumer, event_id, effect)
        )
        """
    )
    index = quote_identifier(f"{tables.effect}_waiting", field="inbox table (effects index)")
    op.execute(
        f"CREATE INDEX {index} ON {tables.qualified_effect} "
        "(consumer, updated_at) WHERE state IN ('needs_decision', 'released')"
    )


def downgrade() -> None:
    op.execute(f"DROP TABLE {outbox_tables().qualified_effect}")
