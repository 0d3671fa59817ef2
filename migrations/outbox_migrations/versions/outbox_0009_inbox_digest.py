"""Inbox claims keep the digest of what the message said: a copy with other content under
the same id is no duplicate.

Until now a claim was ``(consumer, message_id)`` alone, and any later message with that id
was skipped as a duplicate: one that reused an id, or forged it, with other content was
dropped silently. A claim now keeps ``digest`` (``IdempotentConsumer``: the digest of the
Kafka record's key, value and headers, ``outbox.core.kafka_record.content_digest``; an
``Inbox.claim(..., digest=...)`` caller: its own). A copy whose digest differs from the
claim's is a conflict: the consumer dead-letters it with the reason, and ``Inbox.claim``
raises ``ConflictingCopyError``. Claims written before this revision have ``NULL``: their
content is unknown, and any copy of theirs is taken as the same (a duplicate, as before).

The column is nullable without a default: adding it rewrites nothing (a catalog change,
under a brief ``ACCESS EXCLUSIVE`` lock of the inbox). Row-level security (outbox_0005)
filters rows, not columns: its policy covers the column; consumers hold SELECT, INSERT and
DELETE on the whole table (``grant_consumer``), which a new column is part of.

Downgrade drops the column and the digests with it: the SDK's claims without a digest
(``Inbox.claim`` without ``digest=``) work on either side; ``IdempotentConsumer`` needs this
revision, and stops at its first record without it.

Revision ID: outbox_0009
Revises: outbox_0008
Create Date: 2026-11-28
"""

from __future__ import annotations

from alembic import op

from outbox_migrations.names import outbox_tables

revision = "outbox_0009"
down_revision = "outbox_0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    tables = outbox_tables()
    op.execute(f"ALTER TABLE {tables.qualified_inbox} ADD COLUMN digest text")


def downgrade() -> None:
    tables = outbox_tables()
    op.execute(f"ALTER TABLE {tables.qualified_inbox} DROP COLUMN IF EXISTS digest")
