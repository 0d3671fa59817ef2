"""A billing service that charges a payment provider for every ``OrderPlaced``, at most once.

The provider's API is not ours and does not deduplicate
(``examples/outbox_examples/payment_provider.py``). Each charge is a step of the side-effect ledger
(``outbox.effects``): committed as started before the HTTP call, done with the provider's charge id
after. A redelivered event skips a done charge; a charge cut short by a crash or a timeout is looked
up at the provider by its idempotency key (``--no-lookup``: parked for ``outbox effects list``
instead). The provider may still make a charge after our client gave up on it (5 s): its "not
found" is believed only once the charge has *settled* (``--settle-seconds``, 30 s by default: the
longest the provider may take to make and show a charge); a charge retried sooner waits, so a slow
charge is never made twice. The charge id is stored in the service's own table, in the inbox
transaction. Run it beside the order service::

    export OUTBOX_DATABASE_URL=postgresql+psycopg://...      # or: eval "$(outbox stack env)"
    export OUTBOX_KAFKA_BOOTSTRAP_SERVERS=127.0.0.1:59092
    python -m outbox_examples.payment_provider --port 8099 &
    python -m outbox_examples.payment_effects --provider http://127.0.0.1:8099    # Ctrl-C to stop
"""

from __future__ import annotations

import argparse
import os
import signal
import threading
from collections.abc import Callable
from datetime import timedelta
from types import FrameType
from typing import Any

from sqlalchemy import Engine, MetaData, String, create_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, sessionmaker

from outbox.consumer import IdempotentConsumer, ReceivedEvent
from outbox.effects import EffectOutcome, Effects
from outbox_examples.payment_client import ProviderClient

__all__ = ["Charge", "ProviderClient", "consumer", "create_schema", "handler", "main"]

SCHEMA = "billing"
EFFECT = "charge"


class Base(DeclarativeBase):
    metadata = MetaData(schema=SCHEMA)


class Charge(Base):
    __tablename__ = "charges"

    event_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    order_id: Mapped[str] = mapped_column(String(100))
    charge_id: Mapped[str] = mapped_column(String(100))


def create_schema(engine: Engine) -> None:
    with engine.begin() as connection:
        connection.exec_driver_sql(f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}")
        Base.metadata.create_all(connection)


def handler(
    ledger: Effects, client: ProviderClient, *, lookup: bool = True
) -> Callable[[Session, ReceivedEvent], None]:
    """The consumer's handler: charge once per ``OrderPlaced``, keep the charge id."""

    def apply(session: Session, event: ReceivedEvent) -> None:
        if event.event_type != "OrderPlaced":
            return
        outcome = ledger.perform(
            event.event_id,
            EFFECT,
            client.charge,
            lookup=client.find if lookup else None,
            context={"order_id": event.aggregate_id, "amount": event.payload.get("total")},
            settle_after=client.settle_after,  # "not found" sooner than this proves nothing
        )
        if outcome.done and outcome.reference is not None:
            session.merge(
                Charge(
                    event_id=str(event.event_id),
                    order_id=event.aggregate_id,
                    charge_id=outcome.reference,
                )
            )
        # Parked (outcome.needs_decision): nothing to store yet; the partition moves on and
        # an operator decides (`outbox effects list`, then `mark-done` or `release`).
        # A charge that timed out makes the retry wait for it to settle (at most the
        # ledger's max_wait, 30 s), then the provider is asked again.

    return apply


def consumer(
    engine: Engine,
    bootstrap_servers: str,
    provider_url: str,
    *,
    lookup: bool = True,
    group_id: str = "billing",
    topics: tuple[str, ...] = ("outbox.event.order",),
    consumer_options: dict[str, Any] | None = None,
    client: ProviderClient | None = None,
) -> tuple[IdempotentConsumer[Session], Effects]:
    """The billing consumer (inbox name ``billing``) and its ledger (its own transactions)."""
    ledger = Effects(consumer="billing", begin=engine.begin, max_wait=timedelta(seconds=30))
    client = client if client is not None else ProviderClient(provider_url)
    service = IdempotentConsumer(
        name="billing",
        group_id=group_id,
        topics=list(topics),
        bootstrap_servers=bootstrap_servers,
        begin=sessionmaker(engine).begin,
        handler=handler(ledger, client, lookup=lookup),
        consumer_options=consumer_options,
    )
    return service, ledger


def record_released(engine: Engine, outcomes: list[EffectOutcome]) -> None:
    """Keep the charge ids of released charges made again (their event is long past)."""
    with Session(engine) as session, session.begin():
        for outcome in outcomes:
            if outcome.done and outcome.reference is not None:
                session.merge(
                    Charge(
                        event_id=outcome.step.event_id,
                        order_id=str(outcome.step.context["order_id"]),
                        charge_id=outcome.reference,
                    )
                )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--provider", default="http://127.0.0.1:8099")
    parser.add_argument("--no-lookup", action="store_true", help="park cut-short charges")
    parser.add_argument(
        "--settle-seconds",
        type=float,
        default=30.0,
        help="the longest the provider may take to make and show a charge (the settle time)",
    )
    arguments = parser.parse_args()
    engine = create_engine(os.environ["OUTBOX_DATABASE_URL"])
    create_schema(engine)
    bootstrap = os.environ.get("OUTBOX_KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:59092")
    client = ProviderClient(
        arguments.provider, settle_after=timedelta(seconds=arguments.settle_seconds)
    )
    service, ledger = consumer(
        engine, bootstrap, arguments.provider, lookup=not arguments.no_lookup, client=client
    )
    # Charges an operator released (`outbox effects release`) are made again at start-up.
    released = ledger.perform_released(
        EFFECT, client.charge, lookup=client.find, settle_after=client.settle_after
    )
    record_released(engine, released)
    stop = threading.Event()

    def request_stop(signum: int, _frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGINT, request_stop)
    signal.signal(signal.SIGTERM, request_stop)
    service.run(stop)
    print(service.stats)
    engine.dispose()


if __name__ == "__main__":
    main()
