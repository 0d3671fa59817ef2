"""The application's first migration: its orders table.

Revision ID: app_0001
Revises:
"""

import sqlalchemy as sa
from alembic import op

revision = "app_0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "orders",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("total", sa.Numeric(12, 2), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("orders")
