"""Relays side by side: the lease of one leader becomes leases of slices and members.

The outbox's aggregates fall into 32 *slices* (a hash of type and id, computed by the
server: relay/outbox_relay/slices.py). Each slice has a lease row in
``<outbox>_relay_lease`` (``slice 0`` to ``slice 31``): the relay holding it publishes that
slice's rows, alone, in position order. Each running relay holds a *member* row
(``member 0`` to ``member 63``) as long as it lives, so that every relay knows how many share
the work and takes its fair part. Both kinds are taken like the leader's lease was: free,
expired, or held by a session that ended (its marker lock left ``pg_locks``). A bounded
set of rows: the relay role keeps its rights (``SELECT, INSERT, UPDATE``), no ``DELETE``.

The name check allows only these names from now on. It is ``NOT VALID``: a ``leader`` row
written by a relay of an earlier version stays, and relays of this version take no slice
while it is live (that relay stops sending when its lease runs out: it can no longer renew
it, its update fails the check). So a rolling upgrade never has two relays sending one
aggregate. Downgrade removes the slices and members and restores the ``leader`` check.

Revision ID: outbox_0011
Revises: outbox_0010
Create Date: 2026-11-29
"""

from __future__ import annotations

from alembic import op

from outbox_migrations.names import outbox_tables

revision = "outbox_0011"
down_revision = "outbox_0010"
branch_labels = None
depends_on = None

NAMES = "name ~ '^(slice|member) (0|[1-9][0-9]?)$'"


def _lease() -> tuple[str, str]:
    tables = outbox_tables()
    return tables.qualified_relay_lease, f'"{tables.relay_lease}_name_check"'


def upgrade() -> None:
    lease, check = _lease()
    op.execute(
        f"ALTER TABLE {lease} DROP CONSTRAINT IF EXISTS {check}, "
        f"ADD CONSTRAINT {check} CHECK ({NAMES}) NOT VALID"
    )


def downgrade() -> None:
    lease, check = _lease()
    op.execute(f"DELETE FROM {lease} WHERE name <> 'leader'")
    op.execute(
        f"ALTER TABLE {lease} DROP CONSTRAINT IF EXISTS {check}, "
        f"ADD CONSTRAINT {check} CHECK (name = 'leader')"
    )
