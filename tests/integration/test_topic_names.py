"""Aggregate types that would poison CDC or collide on Kafka are refused when published.

Kafka treats ``.`` and ``_`` alike in topic names: ``outbox.event.order.line`` and
``outbox.event.order_line`` cannot both exist, and the second one's records would fail
(the connector's task for every service, or the relay's batches). The database refuses the
second aggregate type in the publishing transaction; it also refuses, by a CHECK, any
aggregate type the SDK refuses, so a hand-written INSERT cannot create a poison row.
"""

from __future__ import annotations

import uuid

import psycopg
import pytest

from outbox import Event, Outbox
from tests.fix_postgres import ScratchDatabase

pytestmark = pytest.mark.timeout(60)


def test_an_aggregate_type_colliding_on_kafka_is_refused_at_publish_time(
    database: ScratchDatabase,
) -> None:
    base = f"t{uuid.uuid4().hex[:8]}"
    with database.connect() as connection:
        with connection.transaction():
            Outbox().publish(connection, Event(f"{base}.line", "1", "Added", {}))
        with connection.transaction():  # the same type again: fine
            Outbox().publish(connection, Event(f"{base}.line", "2", "Added", {}))
        with pytest.raises(psycopg.errors.CheckViolation) as refused:
            with connection.transaction():
                Outbox().publish(connection, Event(f"{base}_line", "1", "Added", {}))
        message = str(refused.value)
        assert f"{base}_line" in message and f"{base}.line" in message
        assert "collides" in message
        with connection.transaction():  # distinct in more than '.' and '_': fine
            Outbox().publish(connection, Event(f"{base}-line", "1", "Added", {}))


def test_a_hand_written_row_with_an_invalid_aggregate_type_is_refused(
    database: ScratchDatabase,
) -> None:
    with database.connect() as connection:
        for bad in ("order line", "order/line", "", "x" * 201, "ordér"):
            with pytest.raises(psycopg.errors.CheckViolation, match="aggregatetype"):
                with connection.transaction():
                    connection.execute(
                        "INSERT INTO outbox.outbox (id, aggregatetype, aggregateid, type, payload)"
                        " VALUES (gen_random_uuid(), %s, '1', 'X', '{}')",
                        (bad,),
                    )
