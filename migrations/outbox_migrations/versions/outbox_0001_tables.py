"""Outbox, dedup and inbox tables; per-aggregate ordering trigger; CDC publication.

Revision ID: outbox_0001
Revises:
Create Date: 2026-11-23
"""

from __future__ import annotations

from alembic import op

from outbox_migrations.names import advisory_lock_class, outbox_tables

revision = "outbox_0001"
down_revision = None
branch_labels = ("outbox",)
depends_on = None


def upgrade() -> None:
    tables = outbox_tables()
    outbox = tables.qualified_outbox
    sequence = tables.qualified_position_sequence
    function = tables.qualified_position_function
    op.execute(f"CREATE SCHEMA IF NOT EXISTS {tables.quoted_schema}")
    op.execute(f"CREATE SEQUENCE {sequence} AS bigint")
    # Column names are the ones Debezium's Outbox Event Router expects by default.
    op.execute(
        f"""
        CREATE TABLE {outbox} (
            id            uuid        PRIMARY KEY,
            aggregatetype text        NOT NULL,
            aggregateid   text        NOT NULL,
            type          text        NOT NULL,
            payload       jsonb       NOT NULL,
            headers       jsonb       NOT NULL DEFAULT '{{}}',
            traceparent   text,
            position      bigint      NOT NULL,
            created_at    timestamptz NOT NULL DEFAULT clock_timestamp()
        )
        """
    )
    op.execute(f"ALTER SEQUENCE {sequence} OWNED BY {outbox}.position")
    op.execute(f'CREATE UNIQUE INDEX "{tables.outbox}_position_key" ON {outbox} (position)')
    # Per-aggregate order: a transaction takes its aggregate's lock before it draws a position
    # and keeps it until it ends, so a second writer of the same aggregate draws its position
    # only after the first committed or rolled back. Positions per aggregate thus follow
    # commit order. (Hash collisions only serialise two aggregates more than needed.)
    op.execute(
        f"""
        CREATE FUNCTION {function}() RETURNS trigger LANGUAGE plpgsql AS $fn$
        BEGIN
            PERFORM pg_advisory_xact_lock(
                {advisory_lock_class(tables)},
                hashtext(NEW.aggregatetype || chr(31) || NEW.aggregateid)
            );
            NEW.position := nextval('{sequence}');
            RETURN NEW;
        END
        $fn$
        """
    )
    op.execute(
        f'CREATE TRIGGER "{tables.outbox}_assign_position" BEFORE INSERT ON {outbox} '
        f"FOR EACH ROW EXECUTE FUNCTION {function}()"
    )
    op.execute(
        f"""
        CREATE TABLE {tables.qualified_dedup} (
            dedup_key  text        PRIMARY KEY,
            event_id   uuid        NOT NULL,
            created_at timestamptz NOT NULL DEFAULT clock_timestamp()
        )
        """
    )
    op.execute(
        f'CREATE INDEX "{tables.dedup}_created_at_idx" ON {tables.qualified_dedup} (created_at)'
    )
    op.execute(
        f"""
        CREATE TABLE {tables.qualified_inbox} (
            consumer    text        NOT NULL,
            message_id  text        NOT NULL,
            received_at timestamptz NOT NULL DEFAULT clock_timestamp(),
            PRIMARY KEY (consumer, message_id)
        )
        """
    )
    op.execute(
        f'CREATE INDEX "{tables.inbox}_received_at_idx" ON {tables.qualified_inbox} (received_at)'
    )
    # Debezium reads this publication (never autocreated): inserts into the outbox only.
    op.execute(
        f"CREATE PUBLICATION {tables.quoted_publication} FOR TABLE {outbox} "
        "WITH (publish = 'insert')"
    )


def downgrade() -> None:
    tables = outbox_tables()
    op.execute(f"DROP PUBLICATION IF EXISTS {tables.quoted_publication}")
    op.execute(f"DROP TABLE IF EXISTS {tables.qualified_inbox}")
    op.execute(f"DROP TABLE IF EXISTS {tables.qualified_dedup}")
    op.execute(f"DROP TABLE IF EXISTS {tables.qualified_outbox}")
    op.execute(f"DROP FUNCTION IF EXISTS {tables.qualified_position_function}()")
    op.execute(f"DROP SEQUENCE IF EXISTS {tables.qualified_position_sequence}")
