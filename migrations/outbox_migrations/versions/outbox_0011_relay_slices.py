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
aggregate. Downgrade removes the slices and members and restores the ``leader`` check:
stop the relays of this version first.

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
CONSTRAINT = "relay_lease_names"


def _drop_checks(lease: str) -> None:
    """Drop the lease table's CHECK constraints, whatever PostgreSQL named them (an inline
    check is named after the table, cut to 63 bytes: long outbox names cut it elsewhere)."""
    op.execute(
        f"""
        DO $drop$
        DECLARE
            found text;
        BEGIN
            FOR found IN
                SELECT conname FROM pg_catalog.pg_constraint
                WHERE conrelid = '{lease}'::regclass AND contype = 'c'
            LOOP
                EXECUTE pg_catalog.format('ALTER TABLE {lease} DROP CONSTRAINT %I', found);
            END LOOP;
        END
        $drop$
        """
    )


def upgrade() -> None:
    lease = outbox_tables().qualified_relay_lease
    _drop_checks(lease)
    op.execute(f'ALTER TABLE {lease} ADD CONSTRAINT "{CONSTRAINT}" CHECK ({NAMES}) NOT VALID')


def downgrade() -> None:
    """Stop every relay of this version first: their leases go, but a relay sends until
    its next renewal, and one of the earlier version may lead meanwhile."""
    lease = outbox_tables().qualified_relay_lease
    op.execute(f"DELETE FROM {lease} WHERE name <> 'leader'")
    _drop_checks(lease)
    op.execute(f"ALTER TABLE {lease} ADD CHECK (name = 'leader')")
