"""Each publisher writes and reads only the aggregate types granted to it.

Until now a publisher role could INSERT an event of any aggregate type, with any id, and
read every pending event's id (``GRANT SELECT (id)``): one service could write events on
another's topic, or learn another's pending event ids and publish a copy first. Now the
database decides, by row-level security on the outbox:

- ``<outbox>_access`` (role, aggregate type) says which types each role may write and read;
  ``*`` means every type (the relay's and the CDC role's rows, and publishers granted before
  this revision, so that an upgrade breaks no running service: narrow them with
  ``outbox db grant ROLE --publisher --aggregate-type T`` then
  ``outbox db revoke ROLE --any-aggregate-type``);
- one policy on the outbox: a row is visible, insertable and deletable for a role that
  holds (directly or through a role it is a member of) its aggregate type or ``*``.
  ``RETURNING id`` of a publish (dedup keys) needs the same, so a publisher reads back
  only its own types' ids. The owner of the tables is not subject to it (it migrates,
  expires, reconciles);
- each role reads its own grants only (the policy's lookup runs as the caller).

Granted here: ``*`` for every role other than the owner (and superusers, who bypass
row-level security) that holds INSERT or SELECT on any column of the outbox.

Downgrade drops the policy and the table (every role is back to its table privileges).

Revision ID: outbox_0008
Revises: outbox_0007
Create Date: 2026-11-28
"""

from __future__ import annotations

from alembic import op

from outbox.core.tables import OutboxTables
from outbox_migrations.names import outbox_tables

revision = "outbox_0008"
down_revision = "outbox_0007"
branch_labels = None
depends_on = None

ANY_TYPE = "*"
"""An access row for every aggregate type (never a valid aggregate type: the SDK's rule)."""


def granted_types_sql(tables: OutboxTables) -> str:
    """SQL: the aggregate types the current role holds (``*`` among them: every type)."""
    return (
        f"SELECT a.aggregatetype FROM {tables.qualified_outbox_access} a "
        "WHERE pg_catalog.pg_has_role(current_user, a.role, 'USAGE')"
    )


def _policy(tables: OutboxTables) -> str:
    return f'"{tables.outbox}_granted_types"'


def upgrade() -> None:
    tables = outbox_tables()
    outbox, access = tables.qualified_outbox, tables.qualified_outbox_access
    op.execute(
        f"CREATE TABLE {access} (role oid NOT NULL, aggregatetype text NOT NULL, "
        "PRIMARY KEY (role, aggregatetype))"
    )
    op.execute(f"ALTER TABLE {access} ENABLE ROW LEVEL SECURITY")
    op.execute(
        f'CREATE POLICY "{tables.outbox_access}_own" ON {access} FOR SELECT '
        "USING (pg_catalog.pg_has_role(current_user, role, 'USAGE'))"
    )
    op.execute(
        f"""
        INSERT INTO {access} (role, aggregatetype)
        SELECT r.oid, '{ANY_TYPE}' FROM pg_catalog.pg_roles r, pg_catalog.pg_class c
        WHERE c.oid = '{outbox}'::pg_catalog.regclass
          AND r.oid <> c.relowner AND NOT r.rolsuper AND r.rolname !~ '^pg_'
          AND (pg_catalog.has_any_column_privilege(r.oid, c.oid, 'INSERT')
               OR pg_catalog.has_any_column_privilege(r.oid, c.oid, 'SELECT'))
        """
    )
    op.execute(
        f"""
        DO $grants$
        DECLARE
            g record;
        BEGIN
            FOR g IN
                SELECT DISTINCT a.role FROM {access} a
            LOOP
                EXECUTE pg_catalog.format(
                    'GRANT SELECT ON {access} TO %I', pg_catalog.pg_get_userbyid(g.role)
                );
            END LOOP;
        END
        $grants$
        """
    )
    granted = granted_types_sql(tables)
    rule = f"(aggregatetype IN ({granted}) OR '{ANY_TYPE}' IN ({granted}))"
    op.execute(f"ALTER TABLE {outbox} ENABLE ROW LEVEL SECURITY")
    op.execute(f"CREATE POLICY {_policy(tables)} ON {outbox} USING {rule} WITH CHECK {rule}")


def downgrade() -> None:
    tables = outbox_tables()
    outbox = tables.qualified_outbox
    op.execute(f"DROP POLICY IF EXISTS {_policy(tables)} ON {outbox}")
    op.execute(f"ALTER TABLE {outbox} DISABLE ROW LEVEL SECURITY")
    op.execute(f"DROP TABLE IF EXISTS {tables.qualified_outbox_access}")
