"""``Effects`` and ``AsyncEffects``: calls to systems you do not control, at most once.

A handler that charges a card, books a parcel or updates a CRM cannot make that call part of
its database transaction. The ledger records each step ``(consumer, event_id, effect)`` as
*started* and commits it before the call, then marks it *done* with the third party's
reference. A redelivered event skips a done step; a started step that was cut short (a
crash, a timeout) is never called blindly again: your ``lookup`` asks the third party, or the
step is parked as *needs decision* for an operator (``outbox effects list``). A lookup's "not
found" is trusted only once the attempt has *settled*: ``settle_after`` (the effect declares
it) has passed since it started; until then ``perform`` waits (at most ``max_wait``) or parks
the step. Invariants and the rejected designs: :mod:`outbox.core.effects`.

    ledger = Effects(consumer="payments", begin=engine.begin)   # a transaction of its own

    def handle(session, event):                                  # IdempotentConsumer handler
        outcome = ledger.perform(
            event.event_id, "charge",
            call=lambda step: provider.charge(event.payload, key=step.idempotency_key),
            lookup=lambda step: provider.find(step.idempotency_key),  # optional
            settle_after=timedelta(seconds=30),   # the provider may record a call this late
            context=event.payload,                               # kept with the step
        )
        if outcome.done:
            session.add(Payment(order=event.aggregate_id, reference=outcome.reference))

``begin`` must open a transaction **of its own** (``engine.begin``, ``sessionmaker(engine).begin``,
or for psycopg a function whose context yields a connection inside ``conn.transaction()``),
never one nested in the handler's: the *started* mark must be committed before the call.
A nested one is detected and refused before anything is called.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Awaitable, Callable, Generator
from contextlib import (
    AbstractAsyncContextManager,
    AbstractContextManager,
    AsyncExitStack,
    ExitStack,
)
from datetime import timedelta
from typing import Any

from outbox._drivers import (
    AsyncExecutor,
    SyncExecutor,
    async_executor,
    drive,
    drive_async,
    still_in_transaction,
    sync_executor,
)
from outbox.core.effect_statements import EffectStatements
from outbox.core.effects import (
    BEGIN,
    COMMIT,
    DEFAULT_MAX_WAIT,
    DEFAULT_SETTLE_AFTER,
    Call,
    EffectOutcome,
    EffectStep,
    Instruction,
    Lookup,
    LookupAnswer,
    StepState,
    Wait,
    check_max_wait,
    check_settle_after,
    check_step_names,
    idempotency_key,
    perform_step,
)
from outbox.core.errors import EffectError, EffectNotPerformedError
from outbox.core.payload import encode_json
from outbox.core.protocol import Rows, delete_expired
from outbox.core.statements import Result, Statement
from outbox.settings import OutboxSettings
from outbox.tracing import performed

__all__ = [
    "DEFAULT_MAX_WAIT",
    "DEFAULT_SETTLE_AFTER",
    "AsyncEffects",
    "EffectNotPerformedError",
    "EffectOutcome",
    "EffectStep",
    "Effects",
    "LookupAnswer",
    "StepState",
    "idempotency_key",
]

SyncCall = Callable[[EffectStep], "str | None"]
SyncLookup = Callable[[EffectStep], LookupAnswer]
AsyncCall = Callable[[EffectStep], Awaitable["str | None"]]
AsyncLookup = Callable[[EffectStep], Awaitable[LookupAnswer]]

_NESTED = (
    "the ledger's transaction did not commit on its own (begin= opened a savepoint or a block "
    "inside another transaction), so the step is not recorded and nothing was called: give "
    "Effects a begin= that opens a transaction of its own, on a connection the handler does "
    "not use (e.g. engine.begin)"
)


class _EffectsBase:
    def __init__(
        self,
        *,
        consumer: str,
        settings: OutboxSettings | None = None,
        max_wait: timedelta = DEFAULT_MAX_WAIT,
    ) -> None:
        check_step_names(consumer, "-", "-")
        self.consumer = consumer
        self.settings = settings if settings is not None else OutboxSettings()
        self.max_wait = check_max_wait(max_wait)
        self._statements = EffectStatements(self.settings.tables)

    def _operation(
        self,
        event_id: object,
        effect: str,
        context: object,
        can_look_up: bool,
        settle_after: timedelta,
    ) -> Generator[Instruction, Any, EffectOutcome]:
        _, event_text, _ = check_step_names(self.consumer, event_id, effect)
        settle_after = check_settle_after(settle_after)
        context_json = encode_json(
            context, root="context", max_bytes=self.settings.max_payload_bytes
        )
        return perform_step(
            self._statements,
            consumer=self.consumer,
            event_id=event_text,
            effect=effect,
            context_json=context_json,
            can_look_up=can_look_up,
            settle_after=settle_after,
            max_wait=self.max_wait,
        )

    def _released(self, effect: str, limit: int) -> Generator[Statement, Rows, list[str]]:
        check_step_names(self.consumer, "-", effect)
        params = {"consumer": self.consumer, "effect": effect, "limit": limit}
        rows = yield Statement(self._statements.released_steps, params, Result.ROWS)
        return [row[0] for row in rows]

    def _delete_expired(self, older_than: timedelta | None) -> Generator[Statement, Rows, int]:
        """Checked at once (before any transaction); the deletion runs when driven."""
        keep = self.settings.effect_retention
        if older_than is not None and older_than < keep:
            raise EffectError(
                f"older_than={older_than} is shorter than done steps must be kept ({keep}: "
                "the longer of OUTBOX_INBOX_RETENTION and OUTBOX_DEAD_LETTER_RETENTION): a "
                "redelivery or a dead letter replayed after its step is gone would call the "
                "third party again"
            )
        return delete_expired(self._statements.delete_expired_done, older_than or keep)


class Effects(_EffectsBase):
    """The ledger for sync code. ``begin()`` opens a transaction of its own (see the module).

    ``max_wait`` bounds how long one ``perform`` waits for a cut-short attempt to settle
    before it parks the step instead (0: never wait); keep it, times the consumer's retries,
    under Kafka's ``max.poll.interval.ms``.
    """

    def __init__(
        self,
        *,
        consumer: str,
        begin: Callable[[], AbstractContextManager[Any]],
        settings: OutboxSettings | None = None,
        max_wait: timedelta = DEFAULT_MAX_WAIT,
    ) -> None:
        super().__init__(consumer=consumer, settings=settings, max_wait=max_wait)
        self._begin = begin

    def perform(
        self,
        event_id: object,
        effect: str,
        call: SyncCall,
        *,
        lookup: SyncLookup | None = None,
        context: object = None,
        settle_after: timedelta = DEFAULT_SETTLE_AFTER,
    ) -> EffectOutcome:
        """Call ``call(step)`` at most once for this step; return where the step stands.

        ``call`` gets the :class:`EffectStep` (send ``step.idempotency_key`` along) and
        returns the third party's reference. ``context`` (JSON, like a payload) is stored
        with the step the first time: an operator sees it, and a released step is called
        again from it (:meth:`perform_released`). ``settle_after``: how long after a call
        starts the third party may still perform it or show it to ``lookup``; a lookup's
        "not found" is acted on only once that much has passed since the attempt started.
        """
        operation = self._operation(event_id, effect, context, lookup is not None, settle_after)
        return performed(self._run(operation, call, lookup))

    def perform_released(
        self,
        effect: str,
        call: SyncCall,
        *,
        lookup: SyncLookup | None = None,
        limit: int = 100,
        settle_after: timedelta = DEFAULT_SETTLE_AFTER,
    ) -> list[EffectOutcome]:
        """Perform this consumer's steps of ``effect`` that an operator released.

        Their event is usually long past, so ``call`` gets the stored ``step.context``.
        """
        with self._begin() as transaction:
            event_ids = drive(self._released(effect, limit), sync_executor(transaction))
        return [
            self.perform(event_id, effect, call, lookup=lookup, settle_after=settle_after)
            for event_id in event_ids
        ]

    def delete_expired(self, older_than: timedelta | None = None) -> int:
        """Delete *done* steps older than ``settings.effect_retention`` (the longer of
        ``OUTBOX_INBOX_RETENTION`` and ``OUTBOX_DEAD_LETTER_RETENTION``; ``older_than`` may
        only lengthen it), except those whose event has a consumer dead letter; never the
        others."""
        deletion = self._delete_expired(older_than)
        with self._begin() as transaction:
            return drive(deletion, sync_executor(transaction))

    def _run(
        self,
        operation: Generator[Instruction, Any, EffectOutcome],
        call: SyncCall,
        lookup: SyncLookup | None,
    ) -> EffectOutcome:
        scope: ExitStack | None = None
        transaction: object = None
        execute: SyncExecutor | None = None
        reply: Any = None
        error: BaseException | None = None
        try:
            while True:
                try:
                    instruction = operation.send(reply) if error is None else operation.throw(error)
                except StopIteration as finished:
                    return finished.value  # type: ignore[no-any-return]
                reply, error = None, None
                if isinstance(instruction, Statement):
                    assert execute is not None
                    reply = execute(instruction)
                elif instruction is BEGIN:
                    scope = ExitStack()
                    transaction = scope.enter_context(self._begin())
                    execute = sync_executor(transaction)
                elif instruction is COMMIT:
                    assert scope is not None
                    scope_to_close, scope, execute = scope, None, None
                    scope_to_close.close()
                    if still_in_transaction(transaction):
                        raise EffectError(_NESTED)
                elif isinstance(instruction, Call):
                    try:
                        reply = call(instruction.step)
                    except Exception as raised:
                        error = raised
                elif isinstance(instruction, Lookup):
                    assert lookup is not None
                    try:
                        reply = lookup(instruction.step)
                    except Exception as raised:
                        error = raised
                elif isinstance(instruction, Wait):
                    time.sleep(instruction.seconds)  # bounded by max_wait; no transaction open
        except BaseException:
            if scope is not None:
                scope.__exit__(*sys.exc_info())
            raise


class AsyncEffects(_EffectsBase):
    """The asyncio twin of :class:`Effects`: ``begin()`` is an async context manager
    (``async_engine.begin``, ``async_sessionmaker(engine).begin``), ``call`` and ``lookup``
    are coroutines."""

    def __init__(
        self,
        *,
        consumer: str,
        begin: Callable[[], AbstractAsyncContextManager[Any]],
        settings: OutboxSettings | None = None,
        max_wait: timedelta = DEFAULT_MAX_WAIT,
    ) -> None:
        super().__init__(consumer=consumer, settings=settings, max_wait=max_wait)
        self._begin = begin

    async def perform(
        self,
        event_id: object,
        effect: str,
        call: AsyncCall,
        *,
        lookup: AsyncLookup | None = None,
        context: object = None,
        settle_after: timedelta = DEFAULT_SETTLE_AFTER,
    ) -> EffectOutcome:
        """Await ``call(step)`` at most once for this step (see :meth:`Effects.perform`)."""
        operation = self._operation(event_id, effect, context, lookup is not None, settle_after)
        return performed(await self._run(operation, call, lookup))

    async def perform_released(
        self,
        effect: str,
        call: AsyncCall,
        *,
        lookup: AsyncLookup | None = None,
        limit: int = 100,
        settle_after: timedelta = DEFAULT_SETTLE_AFTER,
    ) -> list[EffectOutcome]:
        """Perform this consumer's released steps of ``effect`` (see the sync twin)."""
        async with self._begin() as transaction:
            event_ids = await drive_async(
                self._released(effect, limit), await async_executor(transaction)
            )
        return [
            await self.perform(event_id, effect, call, lookup=lookup, settle_after=settle_after)
            for event_id in event_ids
        ]

    async def delete_expired(self, older_than: timedelta | None = None) -> int:
        """Delete expired *done* steps (see :meth:`Effects.delete_expired`)."""
        deletion = self._delete_expired(older_than)
        async with self._begin() as transaction:
            return await drive_async(deletion, await async_executor(transaction))

    async def _run(
        self,
        operation: Generator[Instruction, Any, EffectOutcome],
        call: AsyncCall,
        lookup: AsyncLookup | None,
    ) -> EffectOutcome:
        scope: AsyncExitStack | None = None
        transaction: object = None
        execute: AsyncExecutor | None = None
        reply: Any = None
        error: BaseException | None = None
        try:
            while True:
                try:
                    instruction = operation.send(reply) if error is None else operation.throw(error)
                except StopIteration as finished:
                    return finished.value  # type: ignore[no-any-return]
                reply, error = None, None
                if isinstance(instruction, Statement):
                    assert execute is not None
                    reply = await execute(instruction)
                elif instruction is BEGIN:
                    scope = AsyncExitStack()
                    transaction = await scope.enter_async_context(self._begin())
                    execute = await async_executor(transaction)
                elif instruction is COMMIT:
                    assert scope is not None
                    scope_to_close, scope, execute = scope, None, None
                    await scope_to_close.aclose()
                    if still_in_transaction(transaction):
                        raise EffectError(_NESTED)
                elif isinstance(instruction, Call):
                    try:
                        reply = await call(instruction.step)
                    except Exception as raised:
                        error = raised
                elif isinstance(instruction, Lookup):
                    assert lookup is not None
                    try:
                        reply = await lookup(instruction.step)
                    except Exception as raised:
                        error = raised
                elif isinstance(instruction, Wait):
                    await asyncio.sleep(instruction.seconds)  # bounded by max_wait
        except BaseException:
            if scope is not None:
                await scope.__aexit__(*sys.exc_info())
            raise
