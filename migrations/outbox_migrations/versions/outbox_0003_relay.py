"""Polling relay: xid before position, traceparent never null, dead letters, CDC offsets.

The relay's horizon (relay/outbox_relay/horizon.py) reasons "every transaction that drew a position
up to L has an xid below X". That holds only if a transaction gets its xid before it draws its
position, so the trigger now asks for the xid first (an insert needs one anyway: no cost).

``traceparent`` becomes ``''`` when an event has none (the trigger fills it in): Debezium's
Event Router turns a null column into a header with a null value, which kafka-python cannot
produce; an empty header value is the same on both paths (docs/contract.md).

Revision ID: outbox_0003
Revises: outbox_0002
Create Date: 2026-11-23
"""

from __future__ import annotations

from alembic import op

from outbox_migrations.names import advisory_lock_class, outbox_tables

revision = "outbox_0003"
down_revision = "outbox_0002"
branch_labels = None
depends_on = None


def _position_function(*, relay_ready: bool) -> str:
    tables = outbox_tables()
    extra = (
        "PERFORM pg_current_xact_id();\n"
        "            NEW.traceparent := coalesce(NEW.traceparent, '');"
        if relay_ready
        else ""
    )
    return f"""
        CREATE OR REPLACE FUNCTION {tables.qualified_position_function}()
        RETURNS trigger LANGUAGE plpgsql AS $fn$
        BEGIN
            PERFORM pg_advisory_xact_lock(
                {advisory_lock_class(tables)},
                hashtext(NEW.aggregatetype || chr(31) || NEW.aggregateid)
            );
            {extra}
            NEW.position := nextval('{tables.qualified_position_sequence}');
            RETURN NEW;
        END
        $fn$
        """


def upgrade() -> None:
    tables = outbox_tables()
    op.execute(_position_function(relay_ready=True))
    op.execute(f"UPDATE {tables.qualified_outbox} SET traceparent = '' WHERE traceparent IS NULL")
    op.execute(
        f"ALTER TABLE {tables.qualified_outbox} ALTER COLUMN traceparent SET DEFAULT '', "
        "ALTER COLUMN traceparent SET NOT NULL"
    )
    op.execute(
        f"""
        CREATE TABLE {tables.qualified_dead_letter} (
            id            uuid        PRIMARY KEY,
            aggregatetype text        NOT NULL,
            aggregateid   text        NOT NULL,
            type          text        NOT NULL,
            payload       jsonb       NOT NULL,
            headers       jsonb       NOT NULL,
            traceparent   text        NOT NULL,
            position      bigint      NOT NULL,
            created_at    timestamptz NOT NULL,
            reason        text        NOT NULL,
            failed_at     timestamptz NOT NULL DEFAULT clock_timestamp()
        )
        """
    )
    # Auto mode: how far the relay has read CDC's records, per partition
    # (relay/outbox_relay/cdc_watch.py).
    op.execute(
        f"""
        CREATE TABLE {tables.qualified_relay_offset} (
            topic       text    NOT NULL,
            partition   integer NOT NULL,
            next_offset bigint  NOT NULL,
            PRIMARY KEY (topic, partition)
        )
        """
    )
    op.execute(
        f"""
        CREATE TABLE {tables.qualified_inbox_dead_letter} (
            consumer     text        NOT NULL,
            topic        text        NOT NULL,
            partition    integer     NOT NULL,
            "offset"     bigint      NOT NULL,
            event_id     text,
            key          bytea,
            value        bytea,
            headers      jsonb       NOT NULL,
            reason       text        NOT NULL,
            attempts     integer     NOT NULL,
            failed_at    timestamptz NOT NULL DEFAULT clock_timestamp(),
            PRIMARY KEY (consumer, topic, partition, "offset")
        )
        """
    )


def downgrade() -> None:
    tables = outbox_tables()
    op.execute(f"DROP TABLE {tables.qualified_inbox_dead_letter}")
    op.execute(f"DROP TABLE {tables.qualified_relay_offset}")
    op.execute(f"DROP TABLE {tables.qualified_dead_letter}")
    op.execute(
        f"ALTER TABLE {tables.qualified_outbox} ALTER COLUMN traceparent DROP NOT NULL, "
        "ALTER COLUMN traceparent DROP DEFAULT"
    )
    op.execute(f"UPDATE {tables.qualified_outbox} SET traceparent = NULL WHERE traceparent = ''")
    op.execute(_position_function(relay_ready=False))
