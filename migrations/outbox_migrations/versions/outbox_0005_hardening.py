"""Hardening: the relay's lease, topic names that cannot poison CDC, indexes for expiry.

- ``<outbox>_relay_lease``: who leads the relay, until when (relay/outbox_relay/database.py). Only
  the relay role may write it, so no other role can take or freeze leadership (the advisory
  lock it replaces could be taken by any role that knew its well-known key).
- ``aggregatetype`` is checked by the database as the SDK checks it (Kafka's topic
  alphabet, 1 to 200 characters): a hand-written INSERT cannot create a record that fails
  the connector's task for every service. ``NOT VALID``: rows already there are not
  rechecked (they were written through the SDK, or already broke CDC).
- ``<outbox>_topic``: every aggregate type the outbox has seen, with its topic name's
  *collision key* (Kafka treats ``.`` and ``_`` alike in topic names: ``order.line`` and
  ``order_line`` collide). A new aggregate type whose key is taken is refused by a trigger,
  in the publishing transaction, with a message that names the other type. The trigger
  looks the type up (one index probe per row) and inserts only for a new type. (It first
  let a row through when another open transaction registered the same name: two colliding
  types published at once both got through. It waits for that transaction since
  outbox_0007, whose body this revision installs on new databases.)
- Row-level security, so that one service cannot touch another's rows:
  dedup keys belong to the role that wrote them (``owner``, default ``current_user``; keys
  written before this revision have ``owner = ''`` and stay shared); inbox claims,
  consumer dead letters and side-effect steps belong to the roles a consumer name is
  registered for, in
  ``<inbox>_consumer`` (``outbox db grant ROLE --consumer --consumer-name NAME``). The owner
  of the tables (who runs the migrations) is not subject to the policies.
- Indexes on the dead letters' ``failed_at`` and the heartbeat's ``beat``: expiry of old
  rows (``outbox db expire``, migrations/outbox_migrations/retention.py) without reading the whole
  table.

Revision ID: outbox_0005
Revises: outbox_0004
Create Date: 2026-11-23
"""

from __future__ import annotations

from alembic import op

from outbox_migrations.names import outbox_tables
from outbox_migrations.topic_registry import check_function_sql

revision = "outbox_0005"
down_revision = "outbox_0004"
branch_labels = None
depends_on = None

# The SDK's rule (outbox/core/event.py, _AGGREGATE_TYPE), as a POSIX regular expression.
AGGREGATE_TYPE_PATTERN = "^[A-Za-z0-9._-]{1,200}$"


def _literal(identifier: str) -> str:
    """A validated plain identifier (outbox.core.identifiers) as an SQL string literal."""
    return f"'{identifier}'"


def _names() -> dict[str, str]:
    tables = outbox_tables()
    return {
        "outbox": tables.qualified_outbox,
        "lease": tables.qualified_relay_lease,
        "topic": tables.qualified_topic_registry,
        "function": tables.qualified_topic_check_function,
        "trigger": f'"{tables.topic_check_function}"',
        "constraint": f'"{tables.outbox}_aggregatetype_check"',
        "dead_letter": tables.qualified_dead_letter,
        "dead_letter_index": f'"{tables.dead_letter}_failed_at_idx"',
        "inbox_dead_letter": tables.qualified_inbox_dead_letter,
        "inbox_dead_letter_index": f'"{tables.inbox_dead_letter}_failed_at_idx"',
        "heartbeat": tables.qualified_heartbeat,
        "heartbeat_index": f'"{tables.heartbeat}_beat_idx"',
    }


def upgrade() -> None:
    n = _names()
    op.execute(
        f"""
        CREATE TABLE {n["lease"]} (
            name       text        PRIMARY KEY CHECK (name = 'leader'),
            holder     uuid        NOT NULL,
            pid        integer     NOT NULL,
            marker     bigint      NOT NULL,
            epoch      bigint      NOT NULL,
            expires_at timestamptz NOT NULL
        )
        """
    )
    # Relay roles granted before this revision (they may delete outbox rows) may lead on.
    op.execute(
        f"""
        DO $grant$
        DECLARE
            grantee text;
        BEGIN
            FOR grantee IN
                SELECT DISTINCT g.grantee::text FROM information_schema.role_table_grants g
                WHERE g.table_schema = {_literal(outbox_tables().schema)}
                  AND g.table_name = {_literal(outbox_tables().outbox)}
                  AND g.privilege_type = 'DELETE' AND g.grantee::text <> current_user
            LOOP
                EXECUTE pg_catalog.format(
                    'GRANT SELECT, INSERT, UPDATE ON {n["lease"]} TO %I', grantee
                );
            END LOOP;
        END
        $grant$
        """
    )
    op.execute(
        f"ALTER TABLE {n['outbox']} ADD CONSTRAINT {n['constraint']} "
        f"CHECK (aggregatetype ~ '{AGGREGATE_TYPE_PATTERN}') NOT VALID"
    )
    op.execute(
        f"""
        CREATE TABLE {n["topic"]} (
            aggregatetype text PRIMARY KEY,
            collision_key text NOT NULL UNIQUE
        )
        """
    )
    op.execute(
        f"INSERT INTO {n['topic']} SELECT DISTINCT aggregatetype, "
        f"translate(aggregatetype, '.', '_') FROM {n['outbox']} ORDER BY 1 "
        "ON CONFLICT DO NOTHING"
    )
    # SECURITY DEFINER: publishers need no privilege on the registry. The body is the one
    # outbox_0006 installs (nothing in it resolves through the caller's search_path); this
    # revision first shipped one whose operators and variable type did, and 0006 replaces
    # it where it was installed.
    op.execute(check_function_sql(outbox_tables()))
    op.execute(f"REVOKE ALL ON FUNCTION {n['function']}() FROM PUBLIC")
    op.execute(
        f"CREATE TRIGGER {n['trigger']} BEFORE INSERT ON {n['outbox']} "
        f"FOR EACH ROW EXECUTE FUNCTION {n['function']}()"
    )
    _row_level_security()
    op.execute(f"CREATE INDEX {n['dead_letter_index']} ON {n['dead_letter']} (failed_at)")
    op.execute(f"CREATE INDEX {n['heartbeat_index']} ON {n['heartbeat']} (beat)")
    op.execute(
        f"CREATE INDEX {n['inbox_dead_letter_index']} ON {n['inbox_dead_letter']} (failed_at)"
    )


def _row_level_security() -> None:
    tables = outbox_tables()
    dedup, registry = tables.qualified_dedup, tables.qualified_inbox_consumer
    op.execute(f"ALTER TABLE {dedup} ADD COLUMN owner text NOT NULL DEFAULT ''")
    op.execute(f"ALTER TABLE {dedup} ALTER COLUMN owner SET DEFAULT current_user")
    op.execute(f"ALTER TABLE {dedup} ENABLE ROW LEVEL SECURITY")
    op.execute(
        f'CREATE POLICY "{tables.dedup}_own_keys" ON {dedup} '
        "USING (owner IN (current_user, '')) WITH CHECK (owner IN (current_user, ''))"
    )
    op.execute(f"CREATE TABLE {registry} (consumer text PRIMARY KEY, role text NOT NULL)")
    op.execute(f"ALTER TABLE {registry} ENABLE ROW LEVEL SECURITY")
    op.execute(
        f'CREATE POLICY "{tables.inbox_consumer}_own" ON {registry} USING (role = current_user)'
    )
    mine = f"consumer IN (SELECT r.consumer FROM {registry} r WHERE r.role = current_user)"
    for table, name in (
        (tables.qualified_inbox, tables.inbox),
        (tables.qualified_inbox_dead_letter, tables.inbox_dead_letter),
        (tables.qualified_effect, tables.effect),
    ):
        op.execute(f"ALTER TABLE {table} ENABLE ROW LEVEL SECURITY")
        op.execute(f'CREATE POLICY "{name}_own_consumers" ON {table} USING ({mine})')


def _drop_row_level_security() -> None:
    tables = outbox_tables()
    for table, name in (
        (tables.qualified_effect, tables.effect),
        (tables.qualified_inbox_dead_letter, tables.inbox_dead_letter),
        (tables.qualified_inbox, tables.inbox),
    ):
        op.execute(f'DROP POLICY IF EXISTS "{name}_own_consumers" ON {table}')
        op.execute(f"ALTER TABLE {table} DISABLE ROW LEVEL SECURITY")
    op.execute(f"DROP TABLE IF EXISTS {tables.qualified_inbox_consumer}")
    op.execute(f'DROP POLICY IF EXISTS "{tables.dedup}_own_keys" ON {tables.qualified_dedup}')
    op.execute(f"ALTER TABLE {tables.qualified_dedup} DISABLE ROW LEVEL SECURITY")
    op.execute(f"ALTER TABLE {tables.qualified_dedup} DROP COLUMN IF EXISTS owner")


def downgrade() -> None:
    n = _names()
    _drop_row_level_security()
    schema = outbox_tables().quoted_schema
    op.execute(f"DROP INDEX IF EXISTS {schema}.{n['inbox_dead_letter_index']}")
    op.execute(f"DROP INDEX IF EXISTS {schema}.{n['heartbeat_index']}")
    op.execute(f"DROP INDEX IF EXISTS {schema}.{n['dead_letter_index']}")
    op.execute(f"DROP TRIGGER IF EXISTS {n['trigger']} ON {n['outbox']}")
    op.execute(f"DROP FUNCTION IF EXISTS {n['function']}()")
    op.execute(f"DROP TABLE IF EXISTS {n['topic']}")
    op.execute(f"ALTER TABLE {n['outbox']} DROP CONSTRAINT IF EXISTS {n['constraint']}")
    op.execute(f"DROP TABLE IF EXISTS {n['lease']}")
