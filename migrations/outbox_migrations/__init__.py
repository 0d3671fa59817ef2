"""Alembic migrations of the outbox, dedup and inbox tables and the CDC publication.

They keep their own version table (``outbox_alembic_version`` in the outbox schema), so they
live beside an application's own Alembic history without touching it. Run them with the CLI
(``outbox db upgrade``) or from code, for example at the end of your own ``env.py``, on
``alembic upgrade`` only (examples/alembic_app/env.py)::

    import outbox_migrations
    if outbox_migrations.is_alembic_upgrade(context):
        outbox_migrations.upgrade(connection)    # a SQLAlchemy Connection; you commit

They run on the connection they are given, inside its transaction, without an Alembic
environment of their own, so calling them from inside another ``env.py`` is safe. Schema and
names come from :class:`outbox.OutboxSettings` (``OUTBOX_*`` variables).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from alembic.operations import Operations
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import text
from sqlalchemy.engine import Connection

from outbox.core.errors import ConfigurationError
from outbox.core.identifiers import quote_identifier
from outbox.core.tables import OutboxTables
from outbox.settings import OutboxSettings
from outbox_migrations.names import settings_in_use

__all__ = [
    "VERSION_TABLE",
    "create_cdc_role",
    "create_relay_role",
    "current",
    "downgrade",
    "grant_consumer",
    "grant_publisher",
    "grant_relay",
    "is_alembic_upgrade",
    "register_types",
    "revoke_publisher",
    "upgrade",
]

VERSION_TABLE = "outbox_alembic_version"
ANY_AGGREGATE_TYPE = "*"
"""An outbox access row for every aggregate type (outbox_0008; never a valid type)."""
SCRIPT_LOCATION = Path(__file__).resolve().parent


def upgrade(
    connection: Connection, revision: str = "head", *, settings: OutboxSettings | None = None
) -> None:
    """Upgrade the outbox objects to ``revision`` on ``connection`` (the caller commits)."""
    settings = settings if settings is not None else OutboxSettings()
    script = _script()

    def steps(current: Any, _context: MigrationContext) -> Iterable[Any]:
        return script._upgrade_revs(revision, current)  # as alembic.command does

    connection.execute(text(f"CREATE SCHEMA IF NOT EXISTS {settings.tables.quoted_schema}"))
    _run(connection, settings, script, steps)


def is_alembic_upgrade(context: Any) -> bool:
    """Whether the Alembic command running your ``env.py`` is an online upgrade
    (``alembic upgrade``, ``alembic.command.upgrade``): ``context`` is the ``alembic.context``
    your ``env.py`` configured. The outbox's migrations should follow yours then, and only
    then: ``current``, ``check``, ``history``, ``stamp`` and ``downgrade`` run ``env.py``
    too, and ``--sql`` renders a script without a connection to migrate."""
    migration = context.get_context()
    command = getattr(migration.opts.get("fn"), "__name__", None)  # as alembic.command names it
    return command == "upgrade" and not migration.as_sql


def downgrade(
    connection: Connection, revision: str, *, settings: OutboxSettings | None = None
) -> None:
    """Downgrade the outbox objects to ``revision`` (``base`` removes them all)."""
    settings = settings if settings is not None else OutboxSettings()
    script = _script()

    def steps(current: Any, _context: MigrationContext) -> Iterable[Any]:
        return script._downgrade_revs(revision, current)  # as alembic.command does

    _run(connection, settings, script, steps)


def current(connection: Connection, *, settings: OutboxSettings | None = None) -> str | None:
    """The applied revision, or None when the outbox objects were never created."""
    settings = settings if settings is not None else OutboxSettings()
    return _context(connection, settings).get_current_revision()


def grant_publisher(
    connection: Connection,
    role: str,
    *,
    aggregate_types: Sequence[str] = (),
    any_aggregate_type: bool = False,
    settings: OutboxSettings | None = None,
) -> None:
    """Grant ``role`` what publishing ``aggregate_types`` needs, and nothing more (added to
    what it holds; :func:`revoke_publisher` takes types away).

    It may insert events of those types (the database refuses others: row-level security,
    outbox_0008), read back their ids only, draw positions, and use dedup keys: write a
    key and its event id, never its owner or time (the server's: outbox_0007).
    ``any_aggregate_type`` allows every type (what every publisher could before 0008).
    """
    tables = (settings if settings is not None else OutboxSettings()).tables
    grantee = quote_identifier(role, field="role")
    types = _checked_types(aggregate_types, any_aggregate_type)
    dedup = tables.qualified_dedup
    _execute(
        connection,
        f"GRANT USAGE ON SCHEMA {tables.quoted_schema} TO {grantee}",
        f"GRANT INSERT ON {tables.qualified_outbox} TO {grantee}",
        # Only the event id can be read back: publishes with dedup keys return inserted ids.
        f"GRANT SELECT (id) ON {tables.qualified_outbox} TO {grantee}",
        f"GRANT USAGE ON SEQUENCE {tables.qualified_position_sequence} TO {grantee}",
        # Whole-row INSERT and UPDATE, as granted before outbox_0007, go (with the columns').
        f"REVOKE INSERT, UPDATE ON {dedup} FROM {grantee}",
        f"GRANT SELECT, DELETE ON {dedup} TO {grantee}",
        f"GRANT INSERT (dedup_key, event_id), UPDATE (event_id, created_at) ON {dedup} "
        f"TO {grantee}",
    )
    _allow_types(connection, tables, role, types)


def revoke_publisher(
    connection: Connection,
    role: str,
    *,
    aggregate_types: Sequence[str] = (),
    any_aggregate_type: bool = False,
    settings: OutboxSettings | None = None,
) -> list[str]:
    """Take ``aggregate_types`` (or ``*``, every type) away from ``role``; the types it
    still holds. Its table privileges stay (a role that holds no type writes nothing)."""
    tables = (settings if settings is not None else OutboxSettings()).tables
    types = _checked_types(aggregate_types, any_aggregate_type)
    oid = _role_oid(connection, role)
    access = tables.qualified_outbox_access
    connection.execute(
        text(f"DELETE FROM {access} WHERE role = :oid AND aggregatetype = ANY(:types)"),
        {"oid": oid, "types": types},
    )
    return list(
        connection.execute(
            text(f"SELECT aggregatetype FROM {access} WHERE role = :oid ORDER BY 1"),
            {"oid": oid},
        ).scalars()
    )


def _checked_types(aggregate_types: Sequence[str], any_aggregate_type: bool) -> list[str]:
    if any_aggregate_type:
        if aggregate_types:
            raise ConfigurationError(
                "choose either aggregate types (--aggregate-type) or every type "
                "(--any-aggregate-type), not both"
            )
        return [ANY_AGGREGATE_TYPE]
    if not aggregate_types:
        raise ConfigurationError(
            "name the aggregate types the role publishes: --aggregate-type T (repeat it), "
            "or --any-aggregate-type to allow every type"
        )
    invalid = [t for t in aggregate_types if not _AGGREGATE_TYPE.fullmatch(t)]
    if invalid:
        raise ConfigurationError(
            f"aggregate type {invalid[0]!r} is not one the SDK accepts: 1 to 200 of "
            "A-Z a-z 0-9 . _ -"
        )
    return sorted(set(aggregate_types))


def _role_oid(connection: Connection, role: str) -> int:
    oid = connection.execute(
        text("SELECT oid FROM pg_catalog.pg_roles WHERE rolname = :role"), {"role": role}
    ).scalar()
    if oid is None:
        raise ConfigurationError(f"role {role!r} does not exist: create it first")
    return int(oid)


def _allow_types(
    connection: Connection, tables: OutboxTables, role: str, aggregate_types: Sequence[str]
) -> None:
    """Let ``role`` write and read the outbox rows of ``aggregate_types`` (``*``: all)."""
    access = tables.qualified_outbox_access
    _execute(connection, f"GRANT SELECT ON {access} TO {quote_identifier(role, field='role')}")
    connection.execute(
        text(
            f"INSERT INTO {access} (role, aggregatetype) "
            "SELECT :oid, unnest(CAST(:types AS text[])) ON CONFLICT DO NOTHING"
        ),
        {"oid": _role_oid(connection, role), "types": list(aggregate_types)},
    )


def _ensure_login_role(
    connection: Connection, role: str, password: str, *, replication: bool, variable: str
) -> None:
    """Create ``role`` (or reset its password): LOGIN, and REPLICATION when asked.

    The password never reaches the server: the client computes its SCRAM-SHA-256 verifier
    (libpq's ``PQencryptPasswordConn``) and sends that, so no statement log, failed
    statement or ``pg_stat_activity`` can show the password itself.
    """
    from psycopg import sql

    if not password:
        raise ConfigurationError(f"the role {role} needs a password: set {variable}")
    raw = _psycopg_connection(connection)
    verifier = raw.pgconn.encrypt_password(password.encode(), role.encode(), b"scram-sha-256")
    exists = connection.execute(
        text("SELECT 1 FROM pg_roles WHERE rolname = :role"), {"role": role}
    ).first()
    statement = sql.SQL("{verb} ROLE {role} WITH {options} PASSWORD {verifier}").format(
        verb=sql.SQL("ALTER" if exists else "CREATE"),
        role=sql.Identifier(role),
        options=sql.SQL("LOGIN REPLICATION" if replication else "LOGIN NOREPLICATION"),
        verifier=sql.Literal(verifier.decode("ascii")),
    )
    raw.execute(statement)  # the same connection, inside the caller's transaction
    raw.execute(
        sql.SQL("GRANT CONNECT ON DATABASE {} TO {}").format(
            sql.Identifier(str(raw.info.dbname)), sql.Identifier(role)
        )
    )


def _psycopg_connection(connection: Connection) -> Any:
    """The psycopg 3 connection under a SQLAlchemy ``Connection`` (roles need its libpq)."""
    import psycopg

    raw = connection.connection.dbapi_connection
    if not isinstance(raw, psycopg.Connection):
        raise ConfigurationError(
            "creating a role needs the psycopg 3 driver: use a postgresql+psycopg:// URL"
        )
    return raw


def create_cdc_role(
    connection: Connection, role: str, password: str, *, settings: OutboxSettings | None = None
) -> None:
    """Create or update ``role`` for Debezium: LOGIN REPLICATION, and SELECT on the outbox.

    Nothing else: it reads the outbox table through the publication the migrations made
    (never creates one), and cannot write anything. Running it again resets the password.
    """
    tables = (settings if settings is not None else OutboxSettings()).tables
    grantee = quote_identifier(role, field="role")
    _ensure_login_role(
        connection,
        role,
        password,
        replication=True,
        variable="OUTBOX_CONNECT_DATABASE_PASSWORD",
    )
    _execute(
        connection,
        f"GRANT USAGE ON SCHEMA {tables.quoted_schema} TO {grantee}",
        f"GRANT SELECT ON {tables.qualified_outbox} TO {grantee}",
        # Its heartbeat: insert a beat, delete old ones (see
        # connect/outbox_connect/outbox-connector.json).
        f"GRANT SELECT, INSERT, DELETE ON {tables.qualified_heartbeat} TO {grantee}",
    )
    _allow_types(connection, tables, role, [ANY_AGGREGATE_TYPE])


def create_relay_role(
    connection: Connection, role: str, password: str, *, settings: OutboxSettings | None = None
) -> None:
    """Create or update ``role`` for the polling relay: LOGIN, and :func:`grant_relay` only."""
    quote_identifier(role, field="role")
    _ensure_login_role(
        connection, role, password, replication=False, variable="OUTBOX_RELAY_DATABASE_PASSWORD"
    )
    grant_relay(connection, role, settings=settings)


def grant_consumer(
    connection: Connection,
    role: str,
    *,
    consumers: Sequence[str] = (),
    settings: OutboxSettings | None = None,
) -> None:
    """Grant ``role`` what an idempotent consumer needs: inbox claims, the side-effect
    ledger, and their cleanup, for the consumer names ``consumers`` only (default: the
    role's own name).

    Row-level security keeps each role to the inbox rows of its consumer names: it cannot
    read, delete or pre-claim another service's messages. A name registered for another
    role is refused (one owner per consumer name).
    """
    tables = (settings if settings is not None else OutboxSettings()).tables
    grantee = quote_identifier(role, field="role")
    _execute(
        connection,
        f"GRANT USAGE ON SCHEMA {tables.quoted_schema} TO {grantee}",
        f"GRANT SELECT, INSERT, DELETE ON {tables.qualified_inbox} TO {grantee}",
        f"GRANT SELECT, INSERT, DELETE ON {tables.qualified_inbox_dead_letter} TO {grantee}",
        # The side-effect ledger: steps are recorded, marked, and deleted once done and old.
        f"GRANT SELECT, INSERT, UPDATE, DELETE ON {tables.qualified_effect} TO {grantee}",
        f"GRANT SELECT ON {tables.qualified_inbox_consumer} TO {grantee}",
    )
    for consumer in consumers or [role]:
        owner = connection.execute(
            text(
                f"INSERT INTO {tables.qualified_inbox_consumer} AS c (consumer, role) "
                "VALUES (:consumer, :role) ON CONFLICT (consumer) DO UPDATE "
                "SET role = c.role RETURNING role"
            ),
            {"consumer": consumer, "role": role},
        ).scalar_one()
        if owner != role:
            raise ConfigurationError(
                f"consumer name {consumer!r} belongs to role {owner}: choose another name "
                "with --consumer-name, or revoke it from that role first"
            )


def grant_relay(
    connection: Connection, role: str, *, settings: OutboxSettings | None = None
) -> None:
    """Grant ``role`` what the polling relay needs, and nothing more.

    It reads and deletes outbox rows, reads the position sequence (its horizon), and keeps
    dead letters; it may insert outbox rows only to replay a dead letter. No DDL, no other
    table, no REPLICATION.
    """
    tables = (settings if settings is not None else OutboxSettings()).tables
    grantee = quote_identifier(role, field="role")
    _execute(
        connection,
        f"GRANT USAGE ON SCHEMA {tables.quoted_schema} TO {grantee}",
        f"GRANT SELECT, INSERT, DELETE ON {tables.qualified_outbox} TO {grantee}",
        f"GRANT SELECT, USAGE ON SEQUENCE {tables.qualified_position_sequence} TO {grantee}",
        f"GRANT SELECT, INSERT, DELETE ON {tables.qualified_dead_letter} TO {grantee}",
        f"GRANT SELECT, INSERT, UPDATE ON {tables.qualified_relay_offset} TO {grantee}",
        f"GRANT SELECT, INSERT, UPDATE ON {tables.qualified_relay_lease} TO {grantee}",
    )
    _allow_types(connection, tables, role, [ANY_AGGREGATE_TYPE])


@dataclass
class Registration:
    """What :func:`register_types` did with each aggregate type it was given."""

    registered: list[str] = field(default_factory=list)
    known: list[str] = field(default_factory=list)
    collisions: list[tuple[str, str]] = field(default_factory=list)
    """(type, the registered type it collides with): its topic collides on Kafka."""
    invalid: list[str] = field(default_factory=list)


_AGGREGATE_TYPE = re.compile(r"[A-Za-z0-9._-]{1,200}", re.ASCII)  # the SDK's rule


def register_types(
    connection: Connection,
    aggregate_types: Iterable[str],
    *,
    settings: OutboxSettings | None = None,
) -> Registration:
    """Register aggregate types in the topic registry (as the owner of the tables), in the
    order given: types already delivered that the database has no trace of (migration
    outbox_0007), so that a colliding twin is refused when it is first published."""
    tables = (settings if settings is not None else OutboxSettings()).tables
    registry = tables.qualified_topic_registry
    done = Registration()
    for aggregate_type in aggregate_types:
        if not _AGGREGATE_TYPE.fullmatch(aggregate_type):
            done.invalid.append(aggregate_type)
            continue
        params = {"type": aggregate_type}
        if connection.execute(
            text(
                f"INSERT INTO {registry} (aggregatetype, collision_key) "
                "VALUES (:type, translate(:type, '.', '_')) ON CONFLICT DO NOTHING "
                "RETURNING aggregatetype"
            ),
            params,
        ).first():
            done.registered.append(aggregate_type)
            continue
        holder = connection.execute(
            text(
                f"SELECT aggregatetype FROM {registry} "
                "WHERE collision_key = translate(:type, '.', '_')"
            ),
            params,
        ).scalar_one()
        if holder == aggregate_type:
            done.known.append(aggregate_type)
        else:
            done.collisions.append((aggregate_type, holder))
    return done


def _execute(connection: Connection, *statements: str) -> None:
    """Run utility statements (GRANT ...) whose names were validated and quoted."""
    for statement in statements:
        connection.execute(text(statement))


def _script() -> ScriptDirectory:
    return ScriptDirectory(str(SCRIPT_LOCATION))


def _context(connection: Connection, settings: OutboxSettings, **options: Any) -> MigrationContext:
    return MigrationContext.configure(
        connection,
        opts={
            "version_table": VERSION_TABLE,
            "version_table_schema": settings.schema_name,
            **options,
        },
    )


def _run(
    connection: Connection, settings: OutboxSettings, script: ScriptDirectory, fn: Any
) -> None:
    context = _context(connection, settings, script=script, fn=fn)
    with settings_in_use(settings), Operations.context(context):
        context.run_migrations()
