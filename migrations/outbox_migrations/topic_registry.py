"""The topic registry's trigger function: one definition for the migrations that install it.

It runs as the owner of the tables (``SECURITY DEFINER``: publishers need no privilege on the
registry), so nothing in it may resolve through the inserting role's search_path: every
relation, function, operator (``OPERATOR(pg_catalog.=)``) and type (``pg_catalog.text``) is
schema-qualified. (A ``SET search_path`` clause would do it too, at about 16 us per inserted
row.) See migrations outbox_0005 (the registry) and outbox_0006 (this body on databases that
got an earlier one).
"""

from __future__ import annotations

import zlib

from outbox.core.tables import OutboxTables

__all__ = ["check_function_sql", "registry_lock_class"]


def registry_lock_class(tables: OutboxTables) -> int:
    """The first key of the topic registry's advisory locks: apart from the ordering
    trigger's (``outbox_migrations.names.advisory_lock_class``)."""
    return zlib.crc32(f"{tables.schema}.{tables.outbox}:topics".encode()) - 2**31


def check_function_sql(tables: OutboxTables) -> str:
    """``CREATE OR REPLACE FUNCTION``: keeps the owner and the grants where it exists."""
    registry = tables.qualified_topic_registry
    key = "pg_catalog.translate(NEW.aggregatetype, '.', '_')"
    return f"""
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
