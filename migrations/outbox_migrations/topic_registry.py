"""The topic registry's trigger function: one definition for the migrations that install it.

It runs as the owner of the tables (``SECURITY DEFINER``: publishers need no privilege on the
registry), so nothing in it may resolve through the inserting role's search_path: every
relation, function, operator (``OPERATOR(pg_catalog.=)``) and type (``pg_catalog.text``) is
schema-qualified. (A ``SET search_path`` clause would do it too, at about 16 us per inserted
row.) See migrations outbox_0005 (the registry), outbox_0006 (this body on databases that
got an earlier one) and outbox_0007 (registration that waits instead of letting a row
through).

A known type costs one index probe per row. A new type is inserted into the registry, whose
unique collision key is the point where two transactions meet: while one that registered a
key has not ended, another that registers the same or a colliding type waits for it (on
the index entry, as any unique insert does), then finds the key taken (refused, or the same
type: fine) or free (the first rolled back: it registers its own). So of two colliding
types published at once exactly one gets through. Only a type's first publishers ever wait,
and only while the transaction that registers it is open. (Until outbox_0007 a second
registration did not wait but let its row through, and both colliding types reached the
outbox.)
"""

from __future__ import annotations

from outbox.core.tables import OutboxTables

__all__ = ["AGGREGATE_TYPE_PATTERN", "check_function_sql", "collision_key_sql"]

# The SDK's rule (outbox/core/event.py, _AGGREGATE_TYPE), as a POSIX regular expression; the
# outbox's CHECK constraint (outbox_0005) holds every row to it.
AGGREGATE_TYPE_PATTERN = "^[A-Za-z0-9._-]{1,200}$"


def collision_key_sql(aggregate_type: str) -> str:
    """The SQL expression of a type's collision key: Kafka treats ``.`` and ``_`` alike."""
    return f"pg_catalog.translate({aggregate_type}, '.', '_')"


def check_function_sql(tables: OutboxTables) -> str:
    """``CREATE OR REPLACE FUNCTION``: keeps the owner and the grants where it exists."""
    registry = tables.qualified_topic_registry
    key = collision_key_sql("NEW.aggregatetype")
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
            -- A new type. A transaction that registered the same key and has not ended
            -- makes this insert wait until it does: then the key is taken, or free again.
            INSERT INTO {registry} VALUES (NEW.aggregatetype, {key}) ON CONFLICT DO NOTHING;
            SELECT aggregatetype INTO other FROM {registry}
                WHERE collision_key OPERATOR(pg_catalog.=) {key};
            IF other IS NULL THEN
                -- (not seen: never let such a row through unregistered)
                RAISE EXCEPTION 'aggregate type % could not be registered', NEW.aggregatetype
                    USING ERRCODE = 'serialization_failure',
                    HINT = 'Another transaction registered it meanwhile: try again';
            END IF;
            IF other OPERATOR(pg_catalog.<>) NEW.aggregatetype THEN
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
