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

from outbox_migrations.names import outbox_tables
from outbox_migrations.topic_registry import check_function_sql

revision = "outbox_0006"
down_revision = "outbox_0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # CREATE OR REPLACE keeps the owner, SECURITY DEFINER is restated, and the grants
    # (none for PUBLIC, outbox_0005) stay.
    op.execute(check_function_sql(outbox_tables()))


def downgrade() -> None:
    """Nothing to undo: outbox_0005's downgrade drops the function."""
