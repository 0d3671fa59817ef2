"""An application's Alembic ``env.py`` that also runs the outbox's migrations.

After the application's own migrations, on the same connection, and only when the command is
an upgrade: ``alembic current``, ``check``, ``history``, ``stamp`` and ``downgrade`` run this
file too, and must not migrate anything of the outbox. The outbox keeps its own version
table (``outbox.outbox_alembic_version``), so ``alembic_version`` stays the application's.
tests/integration/test_migrations.py runs it (docs/application-developers.md, "Migrations").
"""

import os

from alembic import context
from sqlalchemy import MetaData, create_engine

import outbox_migrations
from outbox import sqlalchemy_url

target_metadata = MetaData()  # your models' metadata (Base.metadata)


def run_migrations_online() -> None:
    engine = create_engine(sqlalchemy_url(os.environ["OUTBOX_DATABASE_URL"]))
    with engine.connect() as connection:
        context.configure(connection=connection, target_metadata=target_metadata)
        with context.begin_transaction():
            context.run_migrations()
        if outbox_migrations.is_alembic_upgrade(context):  # not current, stamp, downgrade...
            outbox_migrations.upgrade(connection)  # our own version table; you commit
            connection.commit()
    engine.dispose()


run_migrations_online()
