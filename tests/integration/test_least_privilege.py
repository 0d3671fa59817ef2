"""Each role can do what it is granted and no more: publisher, consumer, CDC (the relay's
role: tests/integration/test_relay.py). Row-level security keeps one service's dedup keys
and inbox rows from every other service's role."""

from __future__ import annotations

import secrets
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
import pytest
import sqlalchemy as sa

from outbox import DedupKeyUnavailableError, Effects, Event, Inbox, Outbox
from tests.cli import run_outbox
from tests.fix_postgres import ScratchDatabase

pytestmark = pytest.mark.timeout(60)


def make_role(database: ScratchDatabase, prefix: str) -> tuple[str, str]:
    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    password = secrets.token_urlsafe(12)
    with database.connect(autocommit=True) as admin:
        admin.execute(
            psycopg.sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
                psycopg.sql.Identifier(name), psycopg.sql.Literal(password)
            )
        )
    return name, password


def connect_as(database: ScratchDatabase, role: str, password: str) -> psycopg.Connection:
    return psycopg.connect(
        host="127.0.0.1",
        port=database.cluster.port,
        dbname=database.name,
        user=role,
        password=password,
    )


@pytest.fixture
def publisher(database: ScratchDatabase) -> Iterator[tuple[str, str]]:
    role = make_role(database, "app_publisher")
    result = run_outbox(
        "db",
        "grant",
        role[0],
        "--publisher",
        "--aggregate-type",
        "order",
        env={"OUTBOX_DATABASE_URL": database.url},
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    yield role
    drop_role(database, role[0])


def drop_role(database: ScratchDatabase, name: str) -> None:
    with database.connect(autocommit=True) as admin:
        admin.execute("DELETE FROM outbox.outbox_inbox_consumer WHERE role = %s", (name,))
        identifier = psycopg.sql.Identifier(name)
        admin.execute(psycopg.sql.SQL("DROP OWNED BY {}").format(identifier))
        admin.execute(psycopg.sql.SQL("DROP ROLE {}").format(identifier))


def test_a_publisher_role_publishes_and_cannot_read_events(
    database: ScratchDatabase, publisher: tuple[str, str]
) -> None:
    outbox = Outbox()
    key = f"k-{uuid.uuid4()}"
    with connect_as(database, *publisher) as connection:
        with connection.transaction():
            outbox.publish(connection, Event("order", "1", "OrderPlaced", {"secret": "x"}))
            first = outbox.publish(connection, Event("order", "1", "Paid", {}, dedup_key=key))
        with connection.transaction():
            again = outbox.publish(connection, Event("order", "1", "Paid", {}, dedup_key=key))
            outbox.execute(connection, "SELECT 1", events=[Event("order", "1", "Seen", {})])
        assert again.duplicate and again.event_id == first.event_id
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            connection.execute("SELECT payload FROM outbox.outbox")
        connection.rollback()
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            connection.execute("DELETE FROM outbox.outbox")


def test_a_consumer_role_claims_and_cleans_up(database: ScratchDatabase) -> None:
    import outbox_migrations

    name, password = make_role(database, "app_consumer")
    engine = sa.create_engine(database.url)
    try:
        with engine.begin() as connection:
            outbox_migrations.grant_consumer(connection, name, consumers=["ledger"])
    finally:
        engine.dispose()
    try:
        with connect_as(database, name, password) as connection:
            with connection.transaction():
                assert Inbox().claim(connection, "m-1", consumer="ledger") is True
                assert Inbox().claim(connection, "m-1", consumer="ledger") is False
            with connection.transaction():
                assert Inbox().delete_expired(connection) == 0
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                connection.execute("INSERT INTO outbox.outbox (id) VALUES (gen_random_uuid())")

        @contextmanager
        def ledger_transaction() -> Iterator[psycopg.Connection]:
            with connect_as(database, name, password) as ledger, ledger.transaction():
                yield ledger

        # The side-effect ledger: record, mark, skip on redelivery, clean up.
        effects = Effects(consumer="ledger", begin=ledger_transaction)
        calls = []
        for _ in range(2):
            effects.perform("m-1", "notify", lambda step: calls.append(step) or "ref-1")
        assert len(calls) == 1 and effects.delete_expired() == 0
    finally:
        drop_role(database, name)


def test_a_role_name_that_is_not_a_plain_identifier_is_refused(database: ScratchDatabase) -> None:
    result = run_outbox(
        "db",
        "grant",
        'x"; DROP TABLE y; --',
        "--consumer",
        env={"OUTBOX_DATABASE_URL": database.url},
        timeout=60,
    )
    assert result.returncode == 2
    assert "role" in result.stderr and "plain SQL identifier" in result.stderr


def granted_role(database: ScratchDatabase, prefix: str, *options: str) -> tuple[str, str]:
    role = make_role(database, prefix)
    result = run_outbox(
        "db", "grant", role[0], *options, env={"OUTBOX_DATABASE_URL": database.url}, timeout=60
    )
    assert result.returncode == 0, result.stderr
    return role


def test_a_publisher_cannot_touch_another_services_dedup_keys(database: ScratchDatabase) -> None:
    """Dedup keys are scoped to the role that wrote them (row-level security): another
    publisher cannot read, delete, expire or take them over."""
    orders = granted_role(database, "orders", "--publisher", "--aggregate-type", "order")
    billing = granted_role(database, "billing", "--publisher", "--aggregate-type", "invoice")
    key = f"pay-{uuid.uuid4()}"
    try:
        with connect_as(database, *orders) as connection, connection.transaction():
            first = Outbox().publish(connection, Event("order", "1", "Paid", {}, dedup_key=key))
        with connect_as(database, *billing) as connection:
            assert connection.execute(
                "SELECT count(*) FROM outbox.outbox_dedup WHERE dedup_key = %s", (key,)
            ).fetchone() == (0,)
            deleted = connection.execute(
                "DELETE FROM outbox.outbox_dedup WHERE dedup_key = %s", (key,)
            ).rowcount
            updated = connection.execute(
                "UPDATE outbox.outbox_dedup SET created_at = '-infinity' WHERE dedup_key = %s",
                (key,),
            ).rowcount
            assert (deleted, updated) == (0, 0)
            connection.commit()
            with pytest.raises(DedupKeyUnavailableError, match="held by another database role"):
                with connection.transaction():  # the same key: refused, not a silent no-op
                    Outbox().publish(connection, Event("invoice", "1", "Sent", {}, dedup_key=key))
            with connection.transaction():  # nothing was written, nor taken over
                assert (
                    Outbox()
                    .publish(
                        connection, Event("invoice", "1", "Sent", {}, dedup_key=f"billing:{key}")
                    )
                    .duplicate
                    is False
                )
        with connect_as(database, *orders) as connection, connection.transaction():
            again = Outbox().publish(connection, Event("order", "1", "Paid", {}, dedup_key=key))
        assert again.duplicate and again.event_id == first.event_id
    finally:
        drop_role(database, orders[0])
        drop_role(database, billing[0])


def test_a_consumer_cannot_touch_another_services_inbox_or_ledger(
    database: ScratchDatabase,
) -> None:
    shipping = granted_role(database, "shipping", "--consumer", "--consumer-name", "shipping-x")
    billing = granted_role(database, "billing", "--consumer", "--consumer-name", "billing-x")
    message = f"m-{uuid.uuid4()}"
    try:
        with connect_as(database, *billing) as connection:
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                with connection.transaction():  # pre-claiming shipping's next message
                    Inbox().claim(connection, message, consumer="shipping-x")
            with connection.transaction():
                assert Inbox().claim(connection, message, consumer="billing-x") is True
        with connect_as(database, *shipping) as connection:
            with connection.transaction():
                assert Inbox().claim(connection, message, consumer="shipping-x") is True
            assert connection.execute(
                "SELECT consumer FROM outbox.outbox_inbox WHERE message_id = %s", (message,)
            ).fetchall() == [("shipping-x",)]
            assert (
                connection.execute(
                    "DELETE FROM outbox.outbox_inbox WHERE message_id = %s", (message,)
                ).rowcount
                == 1
            )  # its own claim only
            connection.rollback()
            with connection.transaction():  # a step of shipping's side-effect ledger
                connection.execute(
                    "INSERT INTO outbox.outbox_inbox_effect (consumer, event_id, effect, "
                    "idempotency_key, state, attempt, context) VALUES "
                    "('shipping-x', %s, 'label', gen_random_uuid(), 'started', 1, '{}')",
                    (message,),
                )
        with connect_as(database, *billing) as connection:
            assert connection.execute(
                "SELECT count(*) FROM outbox.outbox_inbox_effect WHERE event_id = %s", (message,)
            ).fetchone() == (0,)
            assert (
                connection.execute(
                    "UPDATE outbox.outbox_inbox_effect SET state = 'released' WHERE event_id = %s",
                    (message,),
                ).rowcount
                == 0
            )
            connection.rollback()
        taken = run_outbox(
            "db",
            "grant",
            billing[0],
            "--consumer",
            "--consumer-name",
            "shipping-x",
            env={"OUTBOX_DATABASE_URL": database.url},
            timeout=60,
        )
        assert taken.returncode == 2 and "belongs to role" in taken.stderr
    finally:
        drop_role(database, shipping[0])
        drop_role(database, billing[0])


def test_the_cdc_role_reads_the_outbox_and_nothing_else(database: ScratchDatabase) -> None:
    import outbox_migrations

    name, password = f"cdc_{uuid.uuid4().hex[:8]}", secrets.token_urlsafe(12)
    engine = sa.create_engine(database.url)
    try:
        with engine.begin() as connection:
            outbox_migrations.create_cdc_role(connection, name, password)
    finally:
        engine.dispose()
    try:
        with connect_as(database, name, password) as connection:
            connection.execute("SELECT count(*) FROM outbox.outbox").fetchone()
            connection.execute("INSERT INTO outbox.outbox_heartbeat DEFAULT VALUES")
            connection.commit()
            for forbidden in (
                "INSERT INTO outbox.outbox (id) VALUES (gen_random_uuid())",
                "DELETE FROM outbox.outbox",
                "SELECT * FROM outbox.outbox_dedup",
                "SELECT * FROM outbox.outbox_inbox",
                "SELECT * FROM outbox.outbox_dead_letter",
                "SELECT * FROM outbox.outbox_relay_lease",
                "CREATE TABLE outbox.sneaky (x int)",
                "CREATE PUBLICATION sneaky FOR ALL TABLES",
            ):
                with pytest.raises(psycopg.errors.InsufficientPrivilege):
                    connection.execute(forbidden)
                connection.rollback()
    finally:
        drop_role(database, name)


HIJACK = """
CREATE FUNCTION {schema}.hijack_{name}(a text, b text) RETURNS {result} LANGUAGE plpgsql AS $$
BEGIN
    IF current_user <> session_user THEN
        RAISE EXCEPTION 'the publisher''s operator ran as %', current_user;
    END IF;
    RETURN a OPERATOR(pg_catalog.{operator}) b;
END $$;
CREATE OPERATOR {schema}.{operator} (LEFTARG = text, RIGHTARG = text,
                                     FUNCTION = {schema}.hijack_{name});
"""


def test_a_publisher_cannot_run_its_own_operators_as_the_table_owner(
    database: ScratchDatabase, publisher: tuple[str, str]
) -> None:
    """The topic registry's trigger runs as the tables' owner: a publisher that puts its own
    ``=``, ``<>`` and ``||`` on text in a schema of its own, first on its search_path, and a
    type ``text`` in pg_temp, must not get them used there (outbox_0006). They raise if
    they ever run as anyone but the publisher; publishing an event of a known and of a new
    aggregate type (the registry's two paths) succeeds."""
    role, _password = publisher
    schema = f"own_{uuid.uuid4().hex[:8]}"
    granted = run_outbox(
        "db",
        "grant",
        role,
        "--publisher",
        "--aggregate-type",
        f"new.{schema}",
        env={"OUTBOX_DATABASE_URL": database.url},
        timeout=60,
    )
    assert granted.returncode == 0, granted.stderr
    with database.connect(autocommit=True) as admin:
        admin.execute(
            psycopg.sql.SQL("GRANT CREATE ON DATABASE {} TO {}").format(
                psycopg.sql.Identifier(database.name), psycopg.sql.Identifier(role)
            )
        )
    outbox = Outbox()
    with connect_as(database, *publisher) as connection:
        connection.execute(f"CREATE SCHEMA {schema}")
        for name, operator, result in (
            ("eq", "=", "boolean"),
            ("ne", "<>", "boolean"),
            ("cat", "||", "text"),
        ):
            connection.execute(
                HIJACK.format(schema=schema, name=name, operator=operator, result=result)
            )
        connection.commit()
        # pg_temp is searched first for types, whatever the path says: a domain "text"
        # there whose check runs the publisher's function.
        connection.execute(
            """
            CREATE FUNCTION pg_temp.guard(value text) RETURNS boolean LANGUAGE plpgsql AS $$
            BEGIN
                IF current_user <> session_user THEN
                    RAISE EXCEPTION 'the publisher''s type ran as %', current_user;
                END IF;
                RETURN true;
            END $$
            """
        )
        connection.execute(
            "CREATE DOMAIN pg_temp.text AS pg_catalog.text CHECK (pg_temp.guard(VALUE))"
        )
        connection.execute(f"SET search_path = {schema}, pg_catalog")
        assert connection.execute("SELECT 'a' = 'a'").fetchone() == (True,), "operators in use"
        with connection.transaction():
            outbox.publish(connection, Event("order", "1", "OrderPlaced", {}))
            outbox.publish(connection, Event(f"new.{schema}", "1", "Created", {}))
    with database.connect() as admin:
        registered = admin.execute(
            "SELECT count(*) FROM outbox.outbox_topic WHERE aggregatetype = %s",
            (f"new.{schema}",),
        ).fetchone()
    assert registered == (1,)


def test_a_publisher_cannot_plant_a_dedup_key_for_another_service(
    database: ScratchDatabase,
) -> None:
    """Owner and time of a dedup key come from the server (``session_user``, the server's
    clock), never from the client: a key planted with an empty owner and a far-future time
    made another service's publish a "duplicate" for good, its event silently dropped."""
    svc_a = granted_role(database, "svc_a", "--publisher", "--aggregate-type", "payment")
    svc_b = granted_role(database, "svc_b", "--publisher", "--aggregate-type", "payment")
    key, other_key = f"payments:{uuid.uuid4()}", f"payments:{uuid.uuid4()}"
    try:
        with connect_as(database, *svc_a) as connection:
            try:
                with connection.transaction():
                    connection.execute(
                        "INSERT INTO outbox.outbox_dedup (dedup_key, event_id, created_at, owner) "
                        "VALUES (%s, gen_random_uuid(), '9999-01-01', '')",
                        (key,),
                    )
                planted = True
            except psycopg.errors.InsufficientPrivilege:
                planted = False
        with connect_as(database, *svc_b) as connection, connection.transaction():
            published = Outbox().publish(
                connection, Event("payment", "42", "Paid", {}, dedup_key=key)
            )
        assert not published.duplicate, "svc_b's event was dropped as a duplicate of svc_a's key"
        assert not planted, "the client chose the key's owner and time"

        with connect_as(database, *svc_a) as connection:
            for columns, values in (("owner", "''"), ("created_at", "'9999-01-01'")):
                with pytest.raises(psycopg.errors.InsufficientPrivilege):
                    with connection.transaction():
                        connection.execute(
                            f"INSERT INTO outbox.outbox_dedup (dedup_key, event_id, {columns}) "
                            f"VALUES (%s, gen_random_uuid(), {values})",
                            (other_key,),
                        )
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                with connection.transaction():
                    connection.execute("UPDATE outbox.outbox_dedup SET owner = ''")
            with connection.transaction():  # what it may write: a key and its event id
                connection.execute(
                    "INSERT INTO outbox.outbox_dedup (dedup_key, event_id) "
                    "VALUES (%s, gen_random_uuid())",
                    (other_key,),
                )
            with connection.transaction():  # a time set by hand: the server's clock wins
                connection.execute(
                    "UPDATE outbox.outbox_dedup SET created_at = '9999-01-01' WHERE dedup_key = %s",
                    (other_key,),
                )
        with database.connect() as admin:
            row = admin.execute(
                "SELECT owner, created_at <= now() FROM outbox.outbox_dedup WHERE dedup_key = %s",
                (other_key,),
            ).fetchone()
        assert row == (svc_a[0], True), "owner and time are the server's"
        with connect_as(database, *svc_b) as connection:
            # A key svc_a holds is refused loudly for svc_b, never a silent "duplicate".
            with pytest.raises(DedupKeyUnavailableError, match="held by another database role"):
                with connection.transaction():
                    Outbox().publish(
                        connection, Event("payment", "43", "Paid", {}, dedup_key=other_key)
                    )
    finally:
        drop_role(database, svc_a[0])
        drop_role(database, svc_b[0])


def test_a_publisher_writes_and_sees_only_its_own_aggregate_types(
    database: ScratchDatabase,
) -> None:
    """The database, not the SDK, keeps each service to its aggregate types: another type's
    event is refused, other services' pending ids are invisible (so none can be copied
    before it is delivered), a revoked type is refused, and a role granted through a
    group role it belongs to publishes as that group may."""
    suffix = uuid.uuid4().hex[:8]  # types of this test only (rows of others stay)
    order, invoice = f"order{suffix}", f"invoice{suffix}"
    orders = granted_role(database, "orders", "--publisher", "--aggregate-type", order)
    billing = granted_role(database, "billing", "--publisher", "--aggregate-type", invoice)
    group = f"billing_group_{uuid.uuid4().hex[:8]}"
    member = make_role(database, "billing_member")
    with database.connect(autocommit=True) as admin:
        admin.execute(psycopg.sql.SQL("CREATE ROLE {}").format(psycopg.sql.Identifier(group)))
        admin.execute(
            psycopg.sql.SQL("GRANT {} TO {}").format(
                psycopg.sql.Identifier(group), psycopg.sql.Identifier(member[0])
            )
        )
    try:
        with connect_as(database, *orders) as connection, connection.transaction():
            real = Outbox().publish(connection, Event(order, "1", "Placed", {"total": 10}))
            Outbox().publish(connection, Event(order, "2", "Placed", {}, dedup_key="o:2"))
        with connect_as(database, *billing) as connection:
            with pytest.raises(psycopg.errors.InsufficientPrivilege, match="row-level security"):
                with connection.transaction():  # another service's type
                    Outbox().publish(connection, Event(order, "1", "Cancelled", {}))
            with connection.transaction():
                own = Outbox().publish(connection, Event(invoice, "9", "Sent", {}, dedup_key="i"))
                assert not own.duplicate
            visible = {row[0] for row in connection.execute("SELECT id FROM outbox.outbox")}
            assert own.event_id in visible
            assert real.event_id not in visible, "billing saw another service's pending ids"
            with pytest.raises(psycopg.errors.InsufficientPrivilege, match="row-level security"):
                with connection.transaction():  # a forged copy of the order's id and type
                    connection.execute(
                        "INSERT INTO outbox.outbox (id, aggregatetype, aggregateid, type, "
                        "payload) VALUES (%s, %s, '1', 'Placed', '{}')",
                        (real.event_id, order),
                    )
        result = run_outbox(
            "db",
            "revoke",
            billing[0],
            "--aggregate-type",
            invoice,
            env={"OUTBOX_DATABASE_URL": database.url},
            timeout=60,
        )
        assert result.returncode == 0 and "publishes: nothing" in result.stdout, result.stderr
        with connect_as(database, *billing) as connection:
            with pytest.raises(psycopg.errors.InsufficientPrivilege, match="row-level security"):
                with connection.transaction():
                    Outbox().publish(connection, Event(invoice, "10", "Sent", {}))

        result = run_outbox(
            "db",
            "grant",
            group,
            "--publisher",
            "--aggregate-type",
            invoice,
            env={"OUTBOX_DATABASE_URL": database.url},
            timeout=60,
        )
        assert result.returncode == 0, result.stderr
        with connect_as(database, *member) as connection, connection.transaction():
            assert not Outbox().publish(connection, Event(invoice, "11", "Sent", {})).duplicate
        with connect_as(database, *member) as connection:
            with pytest.raises(psycopg.errors.InsufficientPrivilege, match="row-level security"):
                with connection.transaction():
                    Outbox().publish(connection, Event(order, "3", "Placed", {}))
    finally:
        drop_role(database, orders[0])
        drop_role(database, billing[0])
        drop_role(database, member[0])
        drop_role(database, group)


def test_a_publisher_must_name_its_aggregate_types(database: ScratchDatabase) -> None:
    role = make_role(database, "unnamed")
    try:
        result = run_outbox(
            "db", "grant", role[0], "--publisher", env={"OUTBOX_DATABASE_URL": database.url}
        )
        assert result.returncode == 2 and "--aggregate-type T" in result.stderr
        result = run_outbox(
            "db",
            "grant",
            role[0],
            "--publisher",
            "--aggregate-type",
            "bad type!",
            env={"OUTBOX_DATABASE_URL": database.url},
        )
        assert result.returncode != 0 and "'bad type!'" in result.stderr, result.stderr
    finally:
        drop_role(database, role[0])
