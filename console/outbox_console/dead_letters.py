"""The dead letters the console lists, shows, replays and discards: the relay's
(:mod:`outbox_relay.dead_letters`) and the consumers' (:mod:`outbox.consumer_dead_letters`),
through the same functions as ``outbox relay dead-letters`` and ``outbox consumer
dead-letters``, with the same refusals.

The relay's are read on a connection of the console's pool, with the relay's own statement
(its functions open a connection each, most of a page's time); one is read by its id."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sqlalchemy import Engine

    from outbox.consumer_dead_letters import (
        ConsumerDeadLetter,
        DeadLetterPlace,
        DeadLetterSummary,
    )
    from outbox_console.panels import Pipeline
    from outbox_relay.dead_letters import DeadLetter

__all__ = ["Letters", "Outcome", "Store"]

LIMIT = 200
"""At most this many of each kind on the page, oldest first."""


@dataclass(frozen=True)
class Letters:
    relay: list[DeadLetter]
    consumers: list[DeadLetterSummary]


@dataclass(frozen=True)
class Outcome:
    """What an action did, in one line; ``ok`` False: refused or gone."""

    ok: bool
    message: str


class Store:
    """Both kinds of dead letters of the pipeline's database."""

    def __init__(self, pipeline: Pipeline, engine: Engine) -> None:
        self.pipeline = pipeline
        self.engine = engine

    def listing(self) -> Letters:
        from outbox.consumer_dead_letters import list_dead_letters as consumer_letters
        from outbox_relay.dead_letters import DeadLetter
        from outbox_relay.statements import RelayStatements

        pipeline = self.pipeline
        statement = RelayStatements(pipeline.outbox.tables).list_dead_letters
        with self.engine.begin() as connection:
            rows = connection.exec_driver_sql(statement, (LIMIT,)).all()
            consumers = consumer_letters(connection, limit=LIMIT, settings=pipeline.outbox)
        return Letters([DeadLetter(*row) for row in rows], consumers)

    def relay_letter(self, event_id: uuid.UUID) -> DeadLetter | None:
        from outbox_relay.dead_letters import DeadLetter

        tables = self.pipeline.outbox.tables
        # The columns of RelayStatements.list_dead_letters (DeadLetter's fields), one row by
        # its key; the table's name is a validated, quoted identifier (OutboxTables).
        statement = (
            "SELECT id, aggregatetype, aggregateid, type, reason, failed_at, "  # noqa: S608
            f"octet_length(payload::text) FROM {tables.qualified_dead_letter} "
            "WHERE id = %s::uuid"
        )
        with self.engine.begin() as connection:
            row = connection.exec_driver_sql(statement, (event_id,)).first()
        return None if row is None else DeadLetter(*row)

    def consumer_letter(self, place: DeadLetterPlace) -> ConsumerDeadLetter | None:
        from outbox.consumer_dead_letters import get_dead_letter

        with self.engine.begin() as connection:
            return get_dead_letter(connection, place, settings=self.pipeline.outbox)

    def replay_relay(self, event_id: uuid.UUID) -> Outcome:
        """``outbox relay dead-letters retry ID``: back into the outbox, same event id."""
        from outbox_relay.dead_letters import retry_dead_letters

        pipeline = self.pipeline
        moved = retry_dead_letters(pipeline.database_url, pipeline.outbox.tables, [event_id])
        if not moved:
            return Outcome(False, f"no dead letter with id {event_id} (replayed or discarded?)")
        return Outcome(
            True,
            f"dead letter {event_id} is back in the outbox: it is published again with its "
            "event id (fix the cause first, or it comes back)",
        )

    def discard_relay(self, event_id: uuid.UUID) -> Outcome:
        """``outbox relay dead-letters discard ID --yes``."""
        from outbox_relay.dead_letters import discard_dead_letters

        pipeline = self.pipeline
        gone = discard_dead_letters(pipeline.database_url, pipeline.outbox.tables, [event_id])
        if not gone:
            return Outcome(False, f"no dead letter with id {event_id}")
        return Outcome(True, f"dead letter {event_id} discarded: its event is never published")

    def replay_consumer(self, place: DeadLetterPlace) -> Outcome:
        """``outbox consumer dead-letters replay CONSUMER TOPIC PARTITION OFFSET``, without
        ``--past-inbox-retention`` (that one stays on the command line)."""
        from outbox.consumer_dead_letters import (
            Replayer,
            get_dead_letter,
            refusal_to_replay,
            replay_dead_letter,
        )

        settings = self.pipeline.outbox
        with self.engine.begin() as connection:
            letter = get_dead_letter(connection, place, settings=settings)
        if letter is None:
            return Outcome(False, f"no dead letter {place}")
        refusal = refusal_to_replay(letter, settings)
        if refusal is not None:
            return Outcome(False, f"{place}: not replayed: {refusal}")
        replayer = Replayer(self.pipeline.kafka)
        try:
            copy = replay_dead_letter(self.engine.begin, replayer, place, settings=settings)
        finally:
            replayer.close()
        if copy is None:
            return Outcome(False, f"{place}: gone meanwhile (discarded, expired or replayed)")
        return Outcome(
            True,
            f"{place} replayed as {copy.record}; the copy comes after newer events of its "
            "aggregate",
        )

    def discard_consumer(self, place: DeadLetterPlace) -> Outcome:
        """``outbox consumer dead-letters discard CONSUMER TOPIC PARTITION OFFSET --yes``."""
        from outbox.consumer_dead_letters import discard_dead_letters

        with self.engine.begin() as connection:
            gone = discard_dead_letters(
                connection, place.consumer, [place], settings=self.pipeline.outbox
            )
        if not gone:
            return Outcome(False, f"no dead letter {place}")
        return Outcome(True, f"{place} discarded: {place.consumer} never handles the record")
