"""Dedup keys owned by the server; a topic registry that knows what was delivered and lets
exactly one of two colliding new types through.

**Dedup keys.** A key's ``owner`` and ``created_at`` were the client's to write, and every
role's policy accepted ``owner = ''`` (the keys written before outbox_0005): a publisher
could insert another service's predictable key with an empty owner and a far-future time,
and that service's publish was then reported as a duplicate, its event dropped, for good.
It could also update or delete every key written before outbox_0005. Now:

- a trigger (``<dedup>_stamp``, before insert and update) sets ``owner = session_user`` and
  ``created_at = clock_timestamp()`` on each row written by a role subject to row-level
  security (publishers), whatever the statement said; the owner of the tables (who runs
  ``outbox db expire`` and may fix a row by hand) is not. The columns' defaults are the
  same. ``session_user`` is the role that logged in: ``SET ROLE`` does not change whose keys
  they are (services that share one login share their keys);
- publishers may insert ``(dedup_key, event_id)`` and update ``(event_id, created_at)`` only
  (the SDK's takeover of an expired key says ``created_at = DEFAULT``; the trigger decides):
  an INSERT that names ``owner`` or ``created_at`` is refused. Roles granted before this
  revision (whole-row INSERT and UPDATE) are converted here;
- one policy per command: a role reads its own keys and the ones written before
  outbox_0005 (``owner = ''``: they still deduplicate), and inserts, updates and deletes
  its own only;
- a key dated in the future (only a client could have written one) is set to now: it
  expires within one window.

A key another service holds stays refused with ``DedupKeyUnavailableError`` until it expires
(``outbox.core.protocol.publish_events``; PostgreSQL 15.18 skips a live conflicting key
that row-level security hides, 15.20 raises: both are that error, never "duplicate").

**Topic registry.** outbox_0005 registered only the aggregate types still in the outbox when
it ran, so a type delivered before it (its rows gone) could later get a colliding twin
(``order_line`` beside ``order.line``): the relay dead-letters the twin's rows, and the
connector may fail its task for every service (both derive the topic the same way,
``outbox.event.<aggregatetype>``). This revision registers what the database still knows
was delivered: the topics the relay has read in auto mode (``<outbox>_relay_offset``) and
those consumers dead-lettered records of (``<inbox>_dead_letter``), both on Kafka; then the
outbox's rows; last the relay's dead letters (a dead letter may be one Kafka refused for a
collision). Where two of them collide, the first in that order is registered. Not
recoverable here: a type whose rows were all delivered by the polling relay or by CDC
without auto mode and that no consumer dead-lettered (the inbox keeps event ids, not
topics; the side-effect ledger event ids and payloads): ``outbox db register-types``
registers them by name, or from the broker's topics (``--from-kafka``). And the
registry's trigger no
longer lets a row through when another open transaction registers the same collision key:
it waits for it (``outbox_migrations.topic_registry``).

Downgrade restores outbox_0006's policy, grants and defaults (keys keep the owner the server
gave them), and keeps the registered types and the trigger body (outbox_0005's downgrade
drops both).

Revision ID: outbox_0007
Revises: outbox_0006
Create Date: 2026-11-25
"""

from __future__ import annotations

from alembic import op

from outbox.core.contract import TOPIC_PREFIX
from outbox.core.tables import OutboxTables
from outbox_migrations.names import outbox_tables
from outbox_migrations.topic_registry import (
    AGGREGATE_TYPE_PATTERN,
    check_function_sql,
    collision_key_sql,
)

revision = "outbox_0007"
down_revision = "outbox_0006"
branch_labels = None
depends_on = None

# What a publisher may write of a dedup key (outbox_migrations.grant_publisher grants the same).
INSERT_COLUMNS = "dedup_key, event_id"
UPDATE_COLUMNS = "event_id, created_at"

_OLD_POLICY = "own_keys"  # outbox_0005's one policy for every command
_POLICIES = {
    "read": "FOR SELECT USING (owner IN (session_user, ''))",
    "insert": "FOR INSERT WITH CHECK (owner = session_user)",
    "update": "FOR UPDATE USING (owner = session_user) WITH CHECK (owner = session_user)",
    "delete": "FOR DELETE USING (owner = session_user)",
}


def _policy(tables: OutboxTables, name: str) -> str:
    return f'"{tables.dedup}_{name}"'


def _stamp_function_sql(tables: OutboxTables) -> str:
    # Runs as the role that writes (not SECURITY DEFINER), every name schema-qualified: a
    # publisher's own function first on its search_path must not stand in for these.
    return f"""
        CREATE FUNCTION {tables.qualified_dedup_stamp_function}() RETURNS trigger
        LANGUAGE plpgsql AS $fn$
        BEGIN
            IF pg_catalog.row_security_active(TG_RELID::pg_catalog.regclass) THEN
                NEW.owner := session_user::pg_catalog.text;
                NEW.created_at := pg_catalog.clock_timestamp();
            END IF;
            RETURN NEW;
        END
        $fn$
        """


def _grantee() -> str:
    """SQL (in a PL/pgSQL loop over ``aclexplode``) naming ``g.grantee`` in a GRANT."""
    return (
        "CASE WHEN g.grantee = 0 THEN 'PUBLIC' "
        "ELSE pg_catalog.quote_ident(pg_catalog.pg_get_userbyid(g.grantee)) END"
    )


def upgrade() -> None:
    tables = outbox_tables()
    dedup = tables.qualified_dedup
    op.execute(
        f"UPDATE {dedup} SET created_at = pg_catalog.clock_timestamp() "
        "WHERE created_at > pg_catalog.clock_timestamp()"
    )
    op.execute(f"ALTER TABLE {dedup} ALTER COLUMN owner SET DEFAULT session_user")
    op.execute(_stamp_function_sql(tables))
    op.execute(f"REVOKE ALL ON FUNCTION {tables.qualified_dedup_stamp_function}() FROM PUBLIC")
    op.execute(
        f'CREATE TRIGGER "{tables.dedup_stamp_function}" BEFORE INSERT OR UPDATE ON {dedup} '
        f"FOR EACH ROW EXECUTE FUNCTION {tables.qualified_dedup_stamp_function}()"
    )
    op.execute(f"DROP POLICY IF EXISTS {_policy(tables, _OLD_POLICY)} ON {dedup}")
    for name, rule in _POLICIES.items():
        op.execute(f"CREATE POLICY {_policy(tables, name)} ON {dedup} {rule}")
    # Publishers granted before: whole-row INSERT and UPDATE become the columns above.
    op.execute(
        f"""
        DO $grants$
        DECLARE
            g record;
        BEGIN
            FOR g IN
                SELECT DISTINCT a.grantee, a.privilege_type
                FROM pg_catalog.pg_class c, pg_catalog.aclexplode(c.relacl) a
                WHERE c.oid = '{dedup}'::pg_catalog.regclass
                  AND a.privilege_type IN ('INSERT', 'UPDATE') AND a.grantee <> c.relowner
            LOOP
                EXECUTE pg_catalog.format(
                    'REVOKE %s ON {dedup} FROM %s', g.privilege_type, {_grantee()}
                );
                EXECUTE pg_catalog.format(
                    'GRANT %s (%s) ON {dedup} TO %s',
                    g.privilege_type,
                    CASE g.privilege_type WHEN 'INSERT' THEN '{INSERT_COLUMNS}'
                                          ELSE '{UPDATE_COLUMNS}' END,
                    {_grantee()}
                );
            END LOOP;
        END
        $grants$
        """
    )
    _register_delivered_types(tables)
    op.execute(check_function_sql(tables))


def _register_delivered_types(tables: OutboxTables) -> None:
    start = len(TOPIC_PREFIX) + 1
    prefix = f"'{TOPIC_PREFIX}'"
    op.execute(
        f"""
        INSERT INTO {tables.qualified_topic_registry} (aggregatetype, collision_key)
        SELECT aggregatetype, {collision_key_sql("aggregatetype")}
        FROM (
            SELECT pg_catalog.substr(topic, {start}) AS aggregatetype, 1 AS rank
                FROM {tables.qualified_relay_offset} WHERE pg_catalog.starts_with(topic, {prefix})
            UNION ALL
            SELECT pg_catalog.substr(topic, {start}), 1
                FROM {tables.qualified_inbox_dead_letter}
                WHERE pg_catalog.starts_with(topic, {prefix})
            UNION ALL
            SELECT aggregatetype, 2 FROM {tables.qualified_outbox}
            UNION ALL
            SELECT aggregatetype, 3 FROM {tables.qualified_dead_letter}
        ) AS known
        WHERE aggregatetype ~ '{AGGREGATE_TYPE_PATTERN}'
        GROUP BY aggregatetype
        ORDER BY min(rank), aggregatetype
        ON CONFLICT DO NOTHING
        """
    )


def downgrade() -> None:
    tables = outbox_tables()
    dedup = tables.qualified_dedup
    # Publishers with the columns get whole rows again, as outbox_0006 granted them
    # (revoking the table's privilege revokes the columns' too).
    op.execute(
        f"""
        DO $grants$
        DECLARE
            g record;
        BEGIN
            FOR g IN
                SELECT DISTINCT a.grantee, a.privilege_type
                FROM pg_catalog.pg_attribute t, pg_catalog.aclexplode(t.attacl) a
                WHERE t.attrelid = '{dedup}'::pg_catalog.regclass
                  AND t.attname = 'event_id' AND a.privilege_type IN ('INSERT', 'UPDATE')
            LOOP
                EXECUTE pg_catalog.format(
                    'REVOKE %s ON {dedup} FROM %s', g.privilege_type, {_grantee()}
                );
                EXECUTE pg_catalog.format(
                    'GRANT %s ON {dedup} TO %s', g.privilege_type, {_grantee()}
                );
            END LOOP;
        END
        $grants$
        """
    )
    for name in _POLICIES:
        op.execute(f"DROP POLICY IF EXISTS {_policy(tables, name)} ON {dedup}")
    op.execute(
        f"CREATE POLICY {_policy(tables, _OLD_POLICY)} ON {dedup} "
        "USING (owner IN (current_user, '')) WITH CHECK (owner IN (current_user, ''))"
    )
    op.execute(f'DROP TRIGGER IF EXISTS "{tables.dedup_stamp_function}" ON {dedup}')
    op.execute(f"DROP FUNCTION IF EXISTS {tables.qualified_dedup_stamp_function}()")
    op.execute(f"ALTER TABLE {dedup} ALTER COLUMN owner SET DEFAULT current_user")
