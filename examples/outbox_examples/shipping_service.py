"""A shipping service that consumes the order service's events, each exactly once.

Every ``OrderPaid`` event creates one shipment; every ``OrderPlaced`` adds to a per-customer
order count. Duplicates (a connector crash, a relay switch, a retry) are skipped by the
inbox, in the same transaction as the side effects. Run it beside the order service::

    export OUTBOX_DATABASE_URL=postgresql+psycopg://...      # or: eval "$(outbox stack env)"
    export OUTBOX_KAFKA_BOOTSTRAP_SERVERS=127.0.0.1:59092
    python -m outbox_examples.shipping_service                      # Ctrl-C to stop
"""

from __future__ import annotations

import os
import signal
import threading
from types import FrameType

from sqlalchemy import Engine, MetaData, String, create_engine, func, select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, sessionmaker

from outbox.consumer import IdempotentConsumer, ReceivedEvent

SCHEMA = "shipping"


class Base(DeclarativeBase):
    metadata = MetaData(schema=SCHEMA)


class Shipment(Base):
    __tablename__ = "shipments"

    id: Mapped[int] = mapped_column(primary_key=True)
    order_id: Mapped[int]
    payment_id: Mapped[str] = mapped_column(String(100))


class CustomerOrders(Base):
    __tablename__ = "customer_orders"

    customer: Mapped[str] = mapped_column(String(100), primary_key=True)
    orders: Mapped[int]


def create_schema(engine: Engine) -> None:
    with engine.begin() as connection:
        connection.exec_driver_sql(f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}")
        Base.metadata.create_all(connection)


def apply(session: Session, event: ReceivedEvent) -> None:  # not idempotent: need not be
    """The side effects of one event. Not idempotent on purpose: the inbox makes it so."""
    if event.event_type == "OrderPaid":
        session.add(
            Shipment(order_id=event.payload["order_id"], payment_id=event.payload["payment_id"])
        )
    elif event.event_type == "OrderPlaced":
        customer = event.payload["customer"]
        session.execute(
            insert(CustomerOrders)
            .values(customer=customer, orders=1)
            .on_conflict_do_update(
                index_elements=[CustomerOrders.customer],
                set_={"orders": CustomerOrders.orders + 1},
            )
        )


def consumer(
    engine: Engine,
    bootstrap_servers: str,
    *,
    group_id: str = "shipping",
    consumer_options: dict[str, object] | None = None,
) -> IdempotentConsumer[Session]:
    """The service's consumer: inbox name ``shipping``, one transaction per event."""
    return IdempotentConsumer(
        name="shipping",  # the inbox's consumer name: stable, one per service
        group_id=group_id,  # the Kafka consumer group ("shipping")
        topics=["outbox.event.order"],  # or pattern=r"^outbox\.event\..*"
        bootstrap_servers=bootstrap_servers,  # "kafka:9092", or "host1:9092,host2:9092"
        begin=sessionmaker(engine).begin,  # one transaction per event (engine.begin: a Connection)
        handler=apply,
        consumer_options=consumer_options,  # more kafka-python KafkaConsumer options
    )


def shipments(engine: Engine) -> int:
    with Session(engine) as session:
        return int(session.scalar(select(func.count()).select_from(Shipment)) or 0)


def main() -> None:
    engine = create_engine(os.environ["OUTBOX_DATABASE_URL"])
    create_schema(engine)
    stop = threading.Event()

    def request_stop(signum: int, _frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGINT, request_stop)
    signal.signal(signal.SIGTERM, request_stop)
    bootstrap = os.environ.get("OUTBOX_KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:59092")
    service = consumer(engine, bootstrap)
    service.run(stop)  # until stop (a threading.Event) is set
    print(f"{service.stats}; shipments in the database: {shipments(engine)}")
    engine.dispose()


if __name__ == "__main__":
    main()
