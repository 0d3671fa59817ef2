"""A small order service: each order and its events are written in one transaction.

It is the demo's order service (``outbox demo`` runs it): its events, aggregate type ``order``
on the rows of ``shop.orders``, are the data docs/analysts.md queries. The docs' examples
publish types and use tables of their own, so they never mix with it. Running it again adds
new orders (ids from ``shop.orders``' sequence, payment dedup keys from those ids).

Run it against any database that has the outbox migrations applied::

    export OUTBOX_DATABASE_URL=postgresql+psycopg://...   # or: eval "$(outbox stack env)"
    python -m outbox_examples.order_service --orders 20
"""

from __future__ import annotations

import argparse
import os
import random
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal

from sqlalchemy import Engine, ForeignKey, MetaData, Numeric, String, create_engine, select
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from outbox import Event, Outbox

SCHEMA = "shop"


class Base(DeclarativeBase):
    metadata = MetaData(schema=SCHEMA)


class Order(Base):
    __tablename__ = "orders"

    id: Mapped[int] = mapped_column(primary_key=True)
    customer: Mapped[str] = mapped_column(String(100))
    total: Mapped[Decimal] = mapped_column(Numeric(12, 2))
    status: Mapped[str] = mapped_column(String(20), default="placed")


class OrderLine(Base):
    __tablename__ = "order_lines"

    id: Mapped[int] = mapped_column(primary_key=True)
    order_id: Mapped[int] = mapped_column(ForeignKey("orders.id"))
    sku: Mapped[str] = mapped_column(String(40))
    quantity: Mapped[int]
    price: Mapped[Decimal] = mapped_column(Numeric(12, 2))


@dataclass(frozen=True)
class Line:
    sku: str
    quantity: int
    price: Decimal


class OutOfStock(Exception):
    """A business rule failed: the whole transaction, events included, rolls back."""


def create_schema(engine: Engine) -> None:
    """The service's own tables (a real service would use its own Alembic history)."""
    with engine.begin() as connection:
        connection.exec_driver_sql(f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}")
        Base.metadata.create_all(connection)


def place_order(session: Session, outbox: Outbox, customer: str, lines: list[Line]) -> int:
    """Insert the order and its lines and publish OrderPlaced, in the caller's transaction."""
    if any(line.sku.startswith("gone-") for line in lines):
        raise OutOfStock(f"out of stock: {[line.sku for line in lines]}")
    total = sum((line.price * line.quantity for line in lines), Decimal("0"))
    order = Order(customer=customer, total=total)
    session.add(order)
    session.flush()  # assigns order.id
    session.add_all(
        OrderLine(order_id=order.id, sku=line.sku, quantity=line.quantity, price=line.price)
        for line in lines
    )
    outbox.publish(
        session,
        Event(
            aggregate_type="order",
            aggregate_id=str(order.id),
            event_type="OrderPlaced",
            payload={"order_id": order.id, "customer": customer, "total": total, "lines": lines},
        ),
    )
    return order.id


def pay_order(session: Session, outbox: Outbox, order_id: int, payment_id: str) -> bool:
    """Mark the order paid and publish OrderPaid; a retried payment is a no-op (dedup key)."""
    result = outbox.publish(
        session,
        Event(
            "order",
            str(order_id),
            "OrderPaid",
            {"order_id": order_id, "payment_id": payment_id},
            dedup_key=f"payment:{payment_id}",
        ),
    )
    if result.duplicate:
        return False
    order = session.get_one(Order, order_id)
    order.status = "paid"
    return True


@dataclass
class RunSummary:
    placed: int = 0
    paid: int = 0
    rejected: int = 0
    duplicate_payments: int = 0


def run(
    engine: Engine,
    orders: int,
    *,
    seed: int = 7,
    on_progress: Callable[[int], None] | None = None,
) -> RunSummary:
    """Place ``orders`` orders; pay about half (retrying a few payments); reject a few."""
    rng = random.Random(seed)
    outbox = Outbox()
    summary = RunSummary()
    for number in range(orders):
        lines = [
            Line(
                sku=f"sku-{rng.randint(1, 50)}",
                quantity=rng.randint(1, 3),
                price=Decimal(rng.randint(100, 9999)) / 100,
            )
            for _ in range(rng.randint(1, 3))
        ]
        if number % 10 == 9:
            lines.append(Line("gone-1", 1, Decimal("1.00")))
        try:
            with Session(engine) as session, session.begin():
                order_id = place_order(session, outbox, f"customer-{rng.randint(1, 8)}", lines)
            summary.placed += 1
        except OutOfStock:
            summary.rejected += 1
        else:
            if rng.random() < 0.5:
                payment_id = f"pay-{order_id}"
                for _attempt in range(2 if rng.random() < 0.3 else 1):  # a client retry
                    with Session(engine) as session, session.begin():
                        if pay_order(session, outbox, order_id, payment_id):
                            summary.paid += 1
                        else:
                            summary.duplicate_payments += 1
        if on_progress is not None:
            on_progress(1)
    return summary


def count_orders(engine: Engine) -> dict[str, int]:
    with Session(engine) as session:
        statuses = session.scalars(select(Order.status)).all()
    counts: dict[str, int] = {}
    for status in statuses:
        counts[status] = counts.get(status, 0) + 1
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--orders", type=int, default=20)
    arguments = parser.parse_args()
    engine = create_engine(os.environ["OUTBOX_DATABASE_URL"])
    create_schema(engine)
    summary = run(engine, arguments.orders)
    print(summary)
    engine.dispose()


if __name__ == "__main__":
    main()
