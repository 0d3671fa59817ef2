"""The topic registry's trigger function: nothing in it resolved through the caller's search_path.

The function (outbox_0005) runs as the owner of the tables (``SECURITY DEFINER``: publishers
need no privilege on the registry), but it took its operators (``=``, ``<>``) and the type
of its variable through the search_path of whoever inserts. A publishing role that can
create a schema could put its own ``=`` on text there, ``SET search_path = <schema>,
pg_catalog`` and insert an event: its function then ran as the owner (seen here: as
``postgres``). Now every function, operator and type in the body is schema-qualified
(``pg_catalog.translate``, ``OPERATOR(pg_catalog.=)``, ``pg_catalog.text``) and every
relation was already. A ``SET search_path`` clause on the function would close it too, but
costs about 16 us per inserted row (outbox_0005's measurement) on every publish.

Downgrade keeps this body: it behaves as outbox_0005's did, without the hole.

Revision ID: outbox_0006
Revises: outbox_0005
Create Date: 2026-11-24
"""

from __future__ import annotations

from alembic import op

from outbox_migrations.names import outbox_tables, registry_lock_class

revision = "outbox_0006"
down_revision = "outbox_0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    tables = outbox_tables()
    registry = tables.qualified_topic_registry
    key = "pg_catalog.translate(NEW.aggregatetype, '.', '_')"
    # CREATE OR REPLACE keeps the owner, SECURITY DEFINER is restated, and the grants
    # (none for PUBLIC, outbox_0005) stay.
    op.execute(
        f"""
        CREATE OR REPLACE FUNCTION {tables.qualified_topic_check_function}() RETURNS trigger
        LANGUAGE plpgsql SECURITY DEFINER AS $fn$
        DECLARE
            other pg_catalog.text;
        BEGIN
            PERFORM 1 FROM {registry}
                WHERE aggregatetype OPERATOR(pg_catalog.=) NEW.aggregatetype;
            IF FOUND THEN
                RETURN NEW;
            END IF;
            -- A new type. If another open transaction registers the same key right now, do
            -- not wait for it (a long transaction would stall every writer of the type):
            -- let the row through; the type is registered by one of them.
            IF NOT pg_catalog.pg_try_advisory_xact_lock(
                {registry_lock_class(tables)}, pg_catalog.hashtext({key})
            ) THEN
                RETURN NEW;
            END IF;
            INSERT INTO {registry} VALUES (NEW.aggregatetype, {key}) ON CONFLICT DO NOTHING;
            SELECT aggregatetype INTO other FROM {registry}
                WHERE collision_key OPERATOR(pg_catalog.=) {key};
            -- (NULL: registered by a transaction this snapshot cannot see: let it through)
            IF other IS NOT NULL AND other OPERATOR(pg_catalog.<>) NEW.aggregatetype THEN
                RAISE EXCEPTION 'aggregate type % collides with aggregate type %',
                    NEW.aggregatetype, other
                    USING ERRCODE = 'check_violation',
                    HINT = 'Kafka treats "." and "_" alike in topic names: use the existing '
                           'aggregate type, or a name that differs otherwise';
            END IF;
            RETURN NEW;
        END
        $fn$
        """
    )


def downgrade() -> None:
    """Nothing to undo: outbox_0005's downgrade drops the function."""
