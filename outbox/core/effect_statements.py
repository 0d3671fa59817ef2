"""SQL text of the side-effect ledger (``outbox_inbox_effect``). Builds statements; never runs them.

Every statement names one step by its key ``(consumer, event_id, effect)``; the operator's
decisions apply only to a step in ``needs_decision`` and return nothing otherwise.

While a step is ``started``, its ``updated_at`` is when its current attempt began: it is set
(``clock_timestamp()``) by the insert and by ``restart_step``, and every other statement
that changes a started step moves it out of ``started``. The settle time is measured from it.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from outbox.core.tables import OutboxTables

__all__ = ["EffectStatements"]

# The context as its JSON text: read back with exact numbers (see EffectStep.context).
_CONTEXT = "context::text AS context"
_STEP = "consumer = %(consumer)s AND event_id = %(event_id)s AND effect = %(effect)s"
_TOUCH = "updated_at = clock_timestamp()"


@dataclass(frozen=True)
class EffectStatements:
    tables: OutboxTables

    @property
    def _table(self) -> str:
        return self.tables.qualified_effect

    @cached_property
    def start_step(self) -> str:
        """Record a new step as started (attempt 1); no row back when it already exists."""
        return (
            f"INSERT INTO {self._table}\n"
            f"  (consumer, event_id, effect, idempotency_key, state, attempt, context)\n"
            f"VALUES (%(consumer)s, %(event_id)s, %(effect)s, %(key)s, 'started', 1,\n"
            f"        CAST(%(context)s AS jsonb))\n"
            f"ON CONFLICT (consumer, event_id, effect) DO NOTHING\n"
            f"RETURNING attempt"
        )

    @cached_property
    def read_step(self) -> str:
        """The step as it stands, without a lock (a done step is skipped with no write)."""
        return (
            f"SELECT state, attempt, reference, reason, {_CONTEXT} FROM {self._table}\n"
            f"WHERE {_STEP}"
        )

    @cached_property
    def lock_step(self) -> str:
        """The step, locked until the transaction ends (waits for a call in progress), with
        when its current attempt began and the database's time now (for the settle time)."""
        return (
            f"SELECT state, attempt, reference, reason, {_CONTEXT}, updated_at,\n"
            f"       clock_timestamp()\n"
            f"FROM {self._table}\n"
            f"WHERE {_STEP}\n"
            f"FOR UPDATE"
        )

    @cached_property
    def mark_done(self) -> str:
        return (
            f"UPDATE {self._table}\n"
            f"SET state = 'done', reference = %(reference)s, reason = %(reason)s, {_TOUCH}\n"
            f"WHERE {_STEP}"
        )

    @cached_property
    def restart_step(self) -> str:
        """A new attempt of a released (or certainly not performed) step."""
        return (
            f"UPDATE {self._table}\n"
            f"SET state = 'started', attempt = attempt + 1, reason = NULL, {_TOUCH}\n"
            f"WHERE {_STEP}\n"
            f"RETURNING attempt"
        )

    @cached_property
    def park_step(self) -> str:
        return (
            f"UPDATE {self._table}\n"
            f"SET state = 'needs_decision', reason = %(reason)s, {_TOUCH}\n"
            f"WHERE {_STEP}"
        )

    @cached_property
    def release_step(self) -> str:
        return (
            f"UPDATE {self._table}\n"
            f"SET state = 'released', reason = %(reason)s, {_TOUCH}\n"
            f"WHERE {_STEP}"
        )

    @cached_property
    def released_steps(self) -> str:
        """Event ids of one consumer's released steps of one effect, oldest first."""
        return (
            f"SELECT event_id FROM {self._table}\n"
            f"WHERE consumer = %(consumer)s AND effect = %(effect)s AND state = 'released'\n"
            f"ORDER BY updated_at\n"
            f"LIMIT %(limit)s"
        )

    @cached_property
    def steps_needing_decision(self) -> str:
        """Parked steps (of one consumer, or of all when it is null), oldest first."""
        return (
            f"SELECT consumer, event_id, effect, idempotency_key, attempt, {_CONTEXT}, reason,\n"
            f"       started_at, updated_at FROM {self._table}\n"
            f"WHERE state = 'needs_decision'\n"
            f"  AND (CAST(%(consumer)s AS text) IS NULL OR consumer = %(consumer)s)\n"
            f"ORDER BY updated_at\n"
            f"LIMIT %(limit)s"
        )

    @cached_property
    def decide_done(self) -> str:
        """An operator's decision: the third party did act; this is its reference."""
        return (
            f"UPDATE {self._table}\n"
            f"SET state = 'done', reference = %(reference)s, reason = %(reason)s, {_TOUCH}\n"
            f"WHERE {_STEP} AND state = 'needs_decision'\n"
            f"RETURNING attempt"
        )

    @cached_property
    def decide_release(self) -> str:
        """An operator's decision: the third party did not act; one more attempt may call."""
        return (
            f"UPDATE {self._table}\n"
            f"SET state = 'released', reason = %(reason)s, {_TOUCH}\n"
            f"WHERE {_STEP} AND state = 'needs_decision'\n"
            f"RETURNING attempt"
        )

    @cached_property
    def decision_summary(self) -> str:
        """Per consumer: how many steps need a decision, and how long the oldest has waited."""
        return (
            f"SELECT consumer, count(*),\n"
            f"       extract(epoch FROM clock_timestamp() - min(updated_at))::float8\n"
            f"FROM {self._table}\n"
            f"WHERE state = 'needs_decision'\n"
            f"GROUP BY consumer\n"
            f"ORDER BY consumer"
        )

    @cached_property
    def delete_expired_done(self) -> str:
        """Done steps older than the window; started and parked steps are never deleted, nor
        a done step whose event has a consumer dead letter still kept (its replay, however
        late, must find the step done rather than call again)."""
        return (
            f"DELETE FROM {self._table} AS step\n"
            f"WHERE step.state = 'done'\n"
            f"  AND step.updated_at\n"
            f"      < clock_timestamp() - make_interval(secs => %(window_seconds)s)\n"
            f"  AND NOT EXISTS (\n"
            f"    SELECT 1 FROM {self.tables.qualified_inbox_dead_letter} AS letter\n"
            f"    WHERE letter.event_id = step.event_id)"
        )
