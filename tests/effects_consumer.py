"""The billing consumer as a child process of a test, which it kills itself at chosen points.

Settings from the environment: ``OUTBOX_DATABASE_URL``, ``EFFECTS_BOOTSTRAP``,
``EFFECTS_TOPIC``, ``EFFECTS_GROUP``, ``EFFECTS_PROVIDER`` (URL), ``EFFECTS_MODE`` (``inbox``:
``IdempotentConsumer`` from examples/outbox_examples/payment_effects.py; ``plain``: a bare Kafka
loop that calls the ledger for every record, so every duplicate reaches it), ``EFFECTS_LOOKUP``
(1/0), ``EFFECTS_SETTLE_SECONDS`` (the charge's settle time), ``EFFECTS_CRASH_PLAN``
(``point:n,...`` with point ``before_call``, ``after_call`` or ``after_done``, n the order
number in the payload) and ``EFFECTS_CRASH_MARKS`` (a folder).

At a planned point the process SIGKILLs itself, once: a mark file says it already did.
Released steps are performed at start-up, as examples/outbox_examples/payment_effects.py does. Runs
until SIGTERM.
"""

from __future__ import annotations

import os
import signal
import threading
from datetime import timedelta
from pathlib import Path
from types import FrameType
from typing import Any

from sqlalchemy import create_engine

from outbox.consumer import ReceivedEvent
from outbox.core.kafka_record import Undecodable, decode_event
from outbox.effects import Effects, EffectStep
from outbox.kafka_reading import KafkaReader, ReaderRole
from outbox_examples import payment_effects

FAST_GROUP = {
    "session_timeout_ms": 6000,
    "heartbeat_interval_ms": 1000,
    "max_poll_interval_ms": 6000,
    "max_poll_records": 4,  # small polls: a crash leaves records to redeliver
}
PLAN = {
    (point, int(n))
    for point, _, n in (
        item.partition(":") for item in os.environ.get("EFFECTS_CRASH_PLAN", "").split(",") if item
    )
}
MARKS = Path(os.environ.get("EFFECTS_CRASH_MARKS", "."))


def crash_if_planned(point: str, n: int) -> None:
    if (point, n) not in PLAN:
        return
    mark = MARKS / f"{point}-{n}"
    if mark.exists():
        return
    mark.write_text("crashed here once\n")
    os.kill(os.getpid(), signal.SIGKILL)


class CrashingClient(payment_effects.ProviderClient):
    def charge(self, step: EffectStep) -> str:
        n = int(step.context["order_id"])
        crash_if_planned("before_call", n)
        charge_id = super().charge(step)
        crash_if_planned("after_call", n)
        return charge_id


def main() -> None:
    env = os.environ
    engine = create_engine(env["OUTBOX_DATABASE_URL"])
    payment_effects.create_schema(engine)
    settle = timedelta(seconds=float(env.get("EFFECTS_SETTLE_SECONDS", "30")))
    client = CrashingClient(env["EFFECTS_PROVIDER"], settle_after=settle)
    lookup = env.get("EFFECTS_LOOKUP") == "1"
    stop = threading.Event()

    def request_stop(signum: int, _frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, request_stop)
    if env["EFFECTS_MODE"] == "inbox":
        service, ledger = payment_effects.consumer(
            engine,
            env["EFFECTS_BOOTSTRAP"],
            env["EFFECTS_PROVIDER"],
            lookup=lookup,
            group_id=env["EFFECTS_GROUP"],
            topics=(env["EFFECTS_TOPIC"],),
            consumer_options=FAST_GROUP,
            client=client,
        )
        inner = service._handler

        def handle_then_maybe_crash(session: Any, event: ReceivedEvent) -> None:
            inner(session, event)
            crash_if_planned("after_done", int(event.aggregate_id))  # before the inbox commit

        service._handler = handle_then_maybe_crash
        released(engine, ledger, client, lookup)
        service.run(stop)
    else:
        ledger = Effects(consumer="billing", begin=engine.begin)
        released(engine, ledger, client, lookup)
        plain_loop(ledger, client, lookup, stop)
    engine.dispose()


def released(engine: Any, ledger: Effects, client: CrashingClient, lookup: bool) -> None:
    outcomes = ledger.perform_released(
        payment_effects.EFFECT,
        client.charge,
        lookup=client.find if lookup else None,
        settle_after=client.settle_after,
    )
    payment_effects.record_released(engine, outcomes)


def plain_loop(
    ledger: Effects, client: CrashingClient, lookup: bool, stop: threading.Event
) -> None:
    env = os.environ
    role = ReaderRole(client_id="effects-plain", group_id=env["EFFECTS_GROUP"])
    reader = KafkaReader(env["EFFECTS_BOOTSTRAP"], role.with_options(FAST_GROUP))
    reader.subscribe([env["EFFECTS_TOPIC"]])
    handle = payment_effects.handler(ledger, client, lookup=lookup)
    try:
        while not stop.is_set():
            records = reader.poll(0.5)
            for record in records:
                event = decode_event(record)
                if isinstance(event, Undecodable):
                    raise RuntimeError(f"the test wrote {event.place}: {event.reason}")
                handle(_NoSession(), event)
                crash_if_planned("after_done", int(event.aggregate_id))
            if records:
                reader.commit()
    finally:
        reader.close()


class _NoSession:
    """The plain loop keeps no charge rows of its own: the ledger is all it has."""

    def merge(self, _instance: object) -> None:
        return None


if __name__ == "__main__":
    main()
