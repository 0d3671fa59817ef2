"""${message}

Revision ID: ${up_revision}
Revises: ${down_revision | comma,n}
Create Date: ${create_date}
"""

from __future__ import annotations

from alembic import op

from outbox_migrations.names import outbox_tables

revision = ${repr(up_revision)}
down_revision = ${repr(down_revision)}
branch_labels = ${repr(branch_labels)}
depends_on = ${repr(depends_on)}


def upgrade() -> None:
    tables = outbox_tables()
    ${upgrades if upgrades else "pass"}


def downgrade() -> None:
    tables = outbox_tables()
    ${downgrades if downgrades else "pass"}
