"""The side-effect ledger on a real PostgreSQL: every driver, cut-short steps, decisions."""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from datetime import timedelta
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker
from sqlalchemy.orm import sessionmaker

from outbox.core.errors import EffectError, EffectStateError
from outbox.effect_decisions import decision_summary, mark_done, release, steps_needing_decision
from outbox.effects import (
    AsyncEffects,
    EffectNotPerformedError,
    Effects,
    EffectStep,
    LookupAnswer,
    StepState,
    idempotency_key,
)
from tests.concurrency import run_in_threads
from tests.fix_postgres import ScratchDatabase

pytestmark = pytest.mark.timeout(120)

# The in-memory provider records a call as it is made: an attempt cut short has settled at once.
SETTLED = timedelta(seconds=0.2)


class Provider:
    """A third party in memory: counts calls per idempotency key."""

    def __init__(self) -> None:
        self.calls: Counter[uuid.UUID] = Counter()

    def charge(self, step: EffectStep) -> str:
        self.calls[step.idempotency_key] += 1
        return f"pay-{step.idempotency_key.hex[:8]}"

    def find(self, step: EffectStep) -> LookupAnswer:
        if self.calls[step.idempotency_key]:
            return LookupAnswer.happened(f"pay-{step.idempotency_key.hex[:8]}")
        return LookupAnswer.not_happened()


class Crash(Exception):
    """Stands for a process dying after the call began: the step stays started."""


def cut_short(ledger: Effects, event_id: str, provider: Provider, *, after_call: bool) -> None:
    def call(step: EffectStep) -> str:
        if after_call:
            provider.charge(step)
        raise Crash

    with pytest.raises(Crash):
        ledger.perform(event_id, "charge", call, context={"amount": 5})


def state_of(engine: sa.Engine, consumer: str, event_id: str) -> tuple[str, int, str | None]:
    with engine.connect() as connection:
        row = connection.execute(
            sa.text(
                "SELECT state, attempt, reference FROM outbox.outbox_inbox_effect "
                "WHERE consumer = :c AND event_id = :e"
            ),
            {"c": consumer, "e": event_id},
        ).one()
    return row.state, row.attempt, row.reference


def name() -> str:
    return f"c-{uuid.uuid4().hex[:8]}"


@contextmanager
def psycopg_transaction(database: ScratchDatabase) -> Iterator[psycopg.Connection]:
    with database.connect() as connection, connection.transaction():
        yield connection


@pytest.mark.parametrize("driver", ["engine.begin", "sessionmaker", "psycopg"])
def test_a_redelivered_event_calls_the_third_party_once(
    driver: str, engine: sa.Engine, database: ScratchDatabase
) -> None:
    begin = {
        "engine.begin": engine.begin,
        "sessionmaker": sessionmaker(engine).begin,
        "psycopg": lambda: psycopg_transaction(database),
    }[driver]
    ledger = Effects(consumer=name(), begin=begin)
    provider = Provider()
    event_id = str(uuid.uuid4())
    first = ledger.perform(event_id, "charge", provider.charge, context={"amount": 5})
    again = ledger.perform(event_id, "charge", provider.charge, context={"amount": 5})
    assert first.done and first.called and first.reference is not None
    assert again.done and not again.called and again.reference == first.reference
    key = idempotency_key(ledger.consumer, event_id, "charge")
    assert first.step.idempotency_key == key and provider.calls == Counter({key: 1})
    assert first.step.context == {"amount": 5}


@asynccontextmanager
async def async_psycopg_transaction(database: ScratchDatabase) -> AsyncIterator[Any]:
    async with (
        await psycopg.AsyncConnection.connect(database.conninfo) as connection,
        connection.transaction(),
    ):
        yield connection


@pytest.mark.parametrize("driver", ["engine.begin", "async_sessionmaker", "psycopg"])
async def test_the_async_ledger_calls_once_and_resolves_a_cut_short_step(
    driver: str, async_engine: AsyncEngine, database: ScratchDatabase
) -> None:
    begin = {
        "engine.begin": async_engine.begin,
        "async_sessionmaker": async_sessionmaker(async_engine).begin,
        "psycopg": lambda: async_psycopg_transaction(database),
    }[driver]
    ledger = AsyncEffects(consumer=name(), begin=begin)
    provider = Provider()

    async def charge(step: EffectStep) -> str:
        return provider.charge(step)

    async def find(step: EffectStep) -> LookupAnswer:
        return provider.find(step)

    event_id = uuid.uuid4()
    outcomes = [await ledger.perform(event_id, "charge", charge, lookup=find) for _ in range(3)]
    assert [o.called for o in outcomes] == [True, False, False]
    assert sum(provider.calls.values()) == 1

    async def charge_then_crash(step: EffectStep) -> str:
        provider.charge(step)
        raise Crash

    cut = uuid.uuid4()
    with pytest.raises(Crash):
        await ledger.perform(cut, "charge", charge_then_crash)
    resolved = await ledger.perform(cut, "charge", charge, lookup=find)
    assert resolved.done and not resolved.called and sum(provider.calls.values()) == 2

    async def crash_before_the_call(_step: EffectStep) -> str:
        raise Crash

    never = uuid.uuid4()
    with pytest.raises(Crash):
        await ledger.perform(never, "charge", crash_before_the_call)
    started = time.monotonic()
    settle = timedelta(seconds=0.5)  # "not found" at once is not believed: the ledger waits
    made = await ledger.perform(never, "charge", charge, lookup=find, settle_after=settle)
    assert made.done and made.called and made.step.attempt == 2
    assert time.monotonic() - started >= 0.3 and sum(provider.calls.values()) == 3


def test_a_cut_short_step_is_parked_without_a_lookup_and_never_called_again(
    engine: sa.Engine,
) -> None:
    ledger = Effects(consumer=name(), begin=engine.begin)
    provider = Provider()
    before, after = str(uuid.uuid4()), str(uuid.uuid4())
    cut_short(ledger, before, provider, after_call=False)
    cut_short(ledger, after, provider, after_call=True)
    assert state_of(engine, ledger.consumer, before) == ("started", 1, None)
    for event_id in (before, after, before, after):
        outcome = ledger.perform(event_id, "charge", provider.charge)
        assert outcome.state is StepState.NEEDS_DECISION and not outcome.called
        assert "idempotency key" in (outcome.reason or "")
    assert sum(provider.calls.values()) == 1  # the one made before the "crash"

    with engine.begin() as connection:
        parked = steps_needing_decision(connection, consumer=ledger.consumer)
        summary = [s for s in decision_summary(connection) if s.consumer == ledger.consumer]
    assert {p.event_id for p in parked} == {before, after}
    assert all(p.context == {"amount": 5} for p in parked)
    assert summary[0].steps == 2 and summary[0].oldest_age_seconds >= 0

    # The operator asks the provider: it has `after`, not `before`.
    with engine.begin() as connection:
        mark_done(
            connection,
            consumer=ledger.consumer,
            event_id=after,
            effect="charge",
            reference="pay-by-hand",
        )
        release(connection, consumer=ledger.consumer, event_id=before, effect="charge")
    with engine.begin() as connection, pytest.raises(EffectStateError, match="needs a decision"):
        release(connection, consumer=ledger.consumer, event_id=after, effect="charge")
    retried = ledger.perform_released("charge", provider.charge)
    assert [(o.step.event_id, o.called, o.step.attempt) for o in retried] == [(before, True, 2)]
    assert ledger.perform(after, "charge", provider.charge).reference == "pay-by-hand"
    assert sorted(provider.calls.values()) == [1, 1]
    with engine.begin() as connection:
        assert steps_needing_decision(connection, consumer=ledger.consumer) == []


def test_a_lookup_resolves_cut_short_steps_exactly_once(engine: sa.Engine) -> None:
    ledger = Effects(consumer=name(), begin=engine.begin)
    provider = Provider()
    before, after = str(uuid.uuid4()), str(uuid.uuid4())
    cut_short(ledger, before, provider, after_call=False)
    cut_short(ledger, after, provider, after_call=True)
    resolved_before = ledger.perform(
        before, "charge", provider.charge, lookup=provider.find, settle_after=SETTLED
    )
    resolved_after = ledger.perform(after, "charge", provider.charge, lookup=provider.find)
    assert resolved_before.done and resolved_before.called and resolved_before.step.attempt == 2
    assert resolved_after.done and not resolved_after.called
    assert sorted(provider.calls.values()) == [1, 1]
    assert state_of(engine, ledger.consumer, after)[0] == "done"

    unknown = str(uuid.uuid4())
    cut_short(ledger, unknown, provider, after_call=True)
    parked = ledger.perform(
        unknown, "charge", provider.charge, lookup=lambda _s: LookupAnswer.unknown("503")
    )
    assert parked.needs_decision and "503" in (parked.reason or "")


def test_a_call_that_certainly_failed_is_released_and_called_again(engine: sa.Engine) -> None:
    ledger = Effects(consumer=name(), begin=engine.begin)
    provider = Provider()
    event_id = str(uuid.uuid4())

    def refused(_step: EffectStep) -> str:
        raise EffectNotPerformedError("connection refused")

    with pytest.raises(EffectNotPerformedError):
        ledger.perform(event_id, "charge", refused)
    assert state_of(engine, ledger.consumer, event_id)[0] == "released"
    outcome = ledger.perform(event_id, "charge", provider.charge)
    assert outcome.called and outcome.step.attempt == 2 and sum(provider.calls.values()) == 1


def test_a_ledger_nested_in_the_handlers_transaction_is_refused(
    database: ScratchDatabase, engine: sa.Engine
) -> None:
    provider = Provider()
    with database.connect() as connection, connection.transaction():

        @contextmanager
        def nested() -> Iterator[psycopg.Connection]:
            with connection.transaction():  # a savepoint in the handler's transaction
                yield connection

        ledger = Effects(consumer=name(), begin=nested)
        with pytest.raises(EffectError, match="transaction of its own"):
            ledger.perform(str(uuid.uuid4()), "charge", provider.charge)
    assert not provider.calls


def test_concurrent_performers_of_one_step_call_once(engine: sa.Engine) -> None:
    ledger = Effects(consumer=name(), begin=engine.begin)
    provider = Provider()
    lock = threading.Lock()
    event_id = str(uuid.uuid4())
    outcomes = []

    def slow_charge(step: EffectStep) -> str:
        time.sleep(0.3)  # a slow third party: the others must wait, not call
        with lock:
            return provider.charge(step)

    def work(_n: int) -> None:
        # One arriving between the first one's two transactions finds the step started and
        # not found by the lookup: it waits for it to settle (1 s) rather than call again.
        settle = timedelta(seconds=1)
        outcome = ledger.perform(
            event_id, "charge", slow_charge, lookup=provider.find, settle_after=settle
        )
        with lock:
            outcomes.append(outcome)

    run_in_threads(work, 4, timeout=60)
    assert sum(provider.calls.values()) == 1
    assert all(o.done for o in outcomes) and sum(o.called for o in outcomes) == 1


def age_steps(engine: sa.Engine, consumer: str, age: timedelta) -> None:
    with engine.begin() as connection:
        connection.execute(
            sa.text(
                "UPDATE outbox.outbox_inbox_effect SET updated_at = now() - :age "
                "WHERE consumer = :c"
            ),
            {"c": consumer, "age": age},
        )


def test_done_steps_expire_and_parked_ones_stay(engine: sa.Engine) -> None:
    ledger = Effects(consumer=name(), begin=engine.begin)
    provider = Provider()
    done, parked = str(uuid.uuid4()), str(uuid.uuid4())
    ledger.perform(done, "charge", provider.charge)
    cut_short(ledger, parked, provider, after_call=False)
    ledger.perform(parked, "charge", provider.charge)
    age_steps(engine, ledger.consumer, ledger.settings.effect_retention + timedelta(hours=1))
    assert ledger.delete_expired() == 1
    assert state_of(engine, ledger.consumer, parked)[0] == "needs_decision"


def test_a_done_step_outlives_inbox_claims_and_its_events_dead_letter(
    engine: sa.Engine,
) -> None:
    """Issue 22: done steps went after 7 days, dead letters after 30: a dead letter replayed
    in between charged again. The step now lives as long as dead letters are kept (30 days,
    derived), and never goes while its event's dead letter is still there."""
    ledger = Effects(consumer=name(), begin=engine.begin)
    provider = Provider()
    lettered, plain = str(uuid.uuid4()), str(uuid.uuid4())
    for event_id in (lettered, plain):
        ledger.perform(event_id, "charge", provider.charge)
    # A week and a day: past the inbox's retention, not the dead letters'.
    age_steps(engine, ledger.consumer, timedelta(days=8))
    assert ledger.delete_expired() == 0
    with engine.begin() as connection:  # the handler failed after the charge: a dead letter
        connection.execute(
            sa.text(
                "INSERT INTO outbox.outbox_inbox_dead_letter (consumer, topic, partition, "
                '"offset", event_id, headers, reason, attempts) VALUES '
                "(:c, 't', 0, 1, :e, '[]', 'the handler failed after the charge', 5)"
            ),
            {"c": ledger.consumer, "e": lettered},
        )
    age_steps(engine, ledger.consumer, timedelta(days=45))  # a longer dead-letter retention
    assert ledger.delete_expired() == 1
    assert state_of(engine, ledger.consumer, lettered)[0] == "done"
    replayed = ledger.perform(lettered, "charge", provider.charge)  # the late replay
    assert replayed.done and not replayed.called and sum(provider.calls.values()) == 2
    with pytest.raises(EffectError, match="OUTBOX_DEAD_LETTER_RETENTION"):
        ledger.delete_expired(older_than=timedelta(days=7))


def test_metrics_count_and_age_the_steps_needing_a_decision(engine: sa.Engine) -> None:
    from prometheus_client import generate_latest

    from outbox.effect_metrics import EffectsMetrics

    ledger = Effects(consumer=name(), begin=engine.begin)
    provider = Provider()
    metrics = EffectsMetrics(engine.begin)
    label = f'{{consumer="{ledger.consumer}"}}'

    def sample(metric: str) -> float | None:
        for line in generate_latest(metrics.registry).decode().splitlines():
            if line.startswith(metric + label):
                return float(line.rsplit(" ", 1)[1])
        return None

    assert sample("outbox_effects_needing_decision") is None
    for _ in range(2):
        event_id = str(uuid.uuid4())
        cut_short(ledger, event_id, provider, after_call=False)
        ledger.perform(event_id, "charge", provider.charge)
    assert sample("outbox_effects_needing_decision") == 2
    age = sample("outbox_effects_oldest_decision_age_seconds")
    assert age is not None and 0 <= age < 60
    assert "outbox_effects_scrape_ok 1.0" in generate_latest(metrics.registry).decode()


def test_metrics_say_when_the_ledger_cannot_be_read() -> None:
    from prometheus_client import generate_latest

    from outbox.effect_metrics import EffectsMetrics

    unreachable = sa.create_engine("postgresql+psycopg://nobody@127.0.0.1:1/none")
    text = generate_latest(EffectsMetrics(unreachable.begin).registry).decode()
    assert "outbox_effects_scrape_ok 0.0" in text
    assert "outbox_effects_needing_decision{" not in text
    unreachable.dispose()


def test_a_database_lost_after_the_call_leaves_the_step_to_the_lookup(
    database: ScratchDatabase,
) -> None:
    ledger_engine = sa.create_engine(
        database.url,
        pool_pre_ping=True,
        connect_args={"application_name": "ledger-under-test"},
    )
    ledger = Effects(consumer=name(), begin=ledger_engine.begin)
    provider = Provider()
    event_id = str(uuid.uuid4())

    def charge_then_lose_the_database(step: EffectStep) -> str:
        reference = provider.charge(step)
        with database.connect(autocommit=True) as admin:
            killed = admin.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE application_name = 'ledger-under-test'"
            ).fetchone()
        assert killed is not None and killed[0] >= 1
        return reference

    with pytest.raises(sa.exc.OperationalError):
        ledger.perform(event_id, "charge", charge_then_lose_the_database, lookup=provider.find)
    assert state_of(ledger_engine, ledger.consumer, event_id)[0] == "started"
    outcome = ledger.perform(event_id, "charge", provider.charge, lookup=provider.find)
    assert outcome.done and not outcome.called and sum(provider.calls.values()) == 1
    ledger_engine.dispose()


def test_the_cli_refuses_a_decision_on_a_step_that_needs_none(
    engine: sa.Engine, database: ScratchDatabase
) -> None:
    from tests.cli import run_outbox

    ledger = Effects(consumer=name(), begin=engine.begin)
    event_id = str(uuid.uuid4())
    ledger.perform(event_id, "charge", Provider().charge)  # done: nothing to decide
    env = {"OUTBOX_DATABASE_URL": database.url}
    refused = run_outbox("effects", "release", ledger.consumer, event_id, "charge", env=env)
    assert refused.returncode == 2 and "needs a decision" in refused.stderr
    missing = run_outbox("effects", "mark-done", ledger.consumer, "nope", "charge", env=env)
    assert missing.returncode == 2 and "outbox effects list" in missing.stderr
    listed = run_outbox("effects", "list", "--consumer", ledger.consumer, env=env)
    assert listed.returncode == 0 and listed.stdout == ""
    assert "0 step(s) need a decision" in listed.stderr
    assert state_of(engine, ledger.consumer, event_id)[0] == "done"


def test_a_call_that_timed_out_is_not_made_again_while_the_provider_may_still_record_it(
    engine: sa.Engine,
) -> None:
    """Issue 22, item 5: the client gives up, the consumer retries, the lookup asks too early.

    The counting HTTP provider records a charge 1 s after its request arrives; the example's
    client gives up after 0.3 s. Each delivery is retried as ``IdempotentConsumer`` does (up
    to 5 attempts, the error re-raised in between).
    """
    from outbox_examples.payment_effects import ProviderClient
    from outbox_examples.payment_provider import PaymentProvider

    provider = PaymentProvider(record_delay=1.0).start()
    try:
        # The effect declares that the provider may record a charge up to 2.5 s after it
        # was sent (its 1 s, with margin): the retry waits until then, and finds it.
        settle = timedelta(seconds=2.5)
        client = ProviderClient(provider.url, timeout=0.3, settle_after=settle)
        ledger = Effects(consumer=name(), begin=engine.begin)
        event_id = str(uuid.uuid4())
        key = str(idempotency_key(ledger.consumer, event_id, "charge"))
        errors: list[str] = []
        outcome = None
        for _attempt in range(5):
            try:
                outcome = ledger.perform(
                    event_id,
                    "charge",
                    client.charge,
                    lookup=client.find,
                    context={"n": 1},
                    settle_after=client.settle_after,
                )
                break
            except OSError as error:  # the client's timeout, re-raised: the consumer retries
                errors.append(type(error).__name__)
        assert provider.wait_idle(timeout=30), "the provider still records charges"
        assert provider.counts() == {key: 1}, f"charged more than once (errors: {errors})"
        assert errors == ["TimeoutError"], errors
        assert outcome is not None and outcome.done and not outcome.called
        assert outcome.reference == provider.find(key) and outcome.step.attempt == 1
    finally:
        provider.stop()


def test_a_call_that_never_arrived_is_made_again_once_settled_and_only_then(
    engine: sa.Engine,
) -> None:
    """The other side of the settle time: a request lost on the way is made again, after it."""
    ledger = Effects(consumer=name(), begin=engine.begin)
    provider = Provider()
    event_id = str(uuid.uuid4())
    settle = timedelta(seconds=1)
    began = time.monotonic()
    calls: list[float] = []

    def charge(step: EffectStep) -> str:
        calls.append(time.monotonic() - began)
        if len(calls) == 1:
            raise TimeoutError("timed out: the request was lost on the way")
        return provider.charge(step)

    with pytest.raises(TimeoutError):
        ledger.perform(event_id, "charge", charge, lookup=provider.find, settle_after=settle)
    outcome = ledger.perform(event_id, "charge", charge, lookup=provider.find, settle_after=settle)
    assert outcome.done and outcome.called and outcome.step.attempt == 2
    assert len(calls) == 2 and calls[1] >= 0.95 * settle.total_seconds(), calls
    assert sum(provider.calls.values()) == 1


def test_a_step_that_cannot_wait_long_enough_is_parked_with_when_to_ask(
    engine: sa.Engine,
) -> None:
    ledger = Effects(consumer=name(), begin=engine.begin, max_wait=timedelta(0))
    provider = Provider()
    event_id = str(uuid.uuid4())
    cut_short(ledger, event_id, provider, after_call=False)
    settle = timedelta(minutes=10)
    outcome = ledger.perform(
        event_id, "charge", provider.charge, lookup=provider.find, settle_after=settle
    )
    assert outcome.needs_decision and not outcome.called and not provider.calls
    assert "settle time (600 s)" in (outcome.reason or "")
    with engine.begin() as connection:
        (parked,) = steps_needing_decision(connection, consumer=ledger.consumer)
    assert parked.event_id == event_id and "Ask again after" in (parked.reason or "")
    with pytest.raises(EffectError, match="max_wait"):
        Effects(consumer=name(), begin=engine.begin, max_wait=timedelta(hours=2))
    with pytest.raises(EffectError, match="settle_after"):
        ledger.perform(event_id, "charge", provider.charge, settle_after=30)  # type: ignore[arg-type]
