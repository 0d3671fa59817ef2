"""The names of the database objects the outbox uses, validated once, rendered quoted."""

from __future__ import annotations

from dataclasses import dataclass

from outbox.core.identifiers import qualified_name, quote_identifier, validate_identifier

__all__ = ["DEFAULT_CDC_TOPIC_PREFIX", "OutboxTables", "cdc_heartbeat_topic"]

DEFAULT_CDC_TOPIC_PREFIX = "outbox"
"""Debezium's ``topic.prefix`` (its logical server name) unless OUTBOX_CONNECT_TOPIC_PREFIX
says otherwise."""


@dataclass(frozen=True, slots=True)
class OutboxTables:
    """Schema and object names. Every name must be a plain identifier (checked here)."""

    schema: str = "outbox"
    outbox: str = "outbox"
    dedup: str = "outbox_dedup"
    inbox: str = "outbox_inbox"
    publication: str = "outbox_publication"

    def __post_init__(self) -> None:
        validate_identifier(self.schema, field="schema")
        validate_identifier(self.outbox, field="outbox table")
        validate_identifier(self.dedup, field="dedup table")
        validate_identifier(self.inbox, field="inbox table")
        validate_identifier(self.publication, field="publication")
        validate_identifier(self.position_sequence, field="outbox table (sequence name)")
        validate_identifier(self.position_function, field="outbox table (function name)")
        for derived in (
            self.relay_lease,
            self.topic_registry,
            self.topic_check_function,
            self.dedup_stamp_function,
            self.inbox_consumer,
            self.outbox_access,
        ):
            validate_identifier(derived, field=f"outbox table (name {derived!r} derived from it)")

    @property
    def position_sequence(self) -> str:
        return f"{self.outbox}_position_seq"

    @property
    def position_function(self) -> str:
        return f"{self.outbox}_assign_position"

    @property
    def qualified_outbox(self) -> str:
        return qualified_name(self.schema, self.outbox, field="outbox table")

    @property
    def qualified_dedup(self) -> str:
        return qualified_name(self.schema, self.dedup, field="dedup table")

    @property
    def dedup_stamp_function(self) -> str:
        """Sets a dedup key's owner and time from the server, never the client (outbox_0007)."""
        return f"{self.dedup}_stamp"

    @property
    def qualified_dedup_stamp_function(self) -> str:
        return qualified_name(self.schema, self.dedup_stamp_function, field="function")

    @property
    def heartbeat(self) -> str:
        return f"{self.outbox}_heartbeat"

    @property
    def qualified_heartbeat(self) -> str:
        return qualified_name(self.schema, self.heartbeat, field="outbox table (heartbeat)")

    @property
    def dead_letter(self) -> str:
        """Rows the relay could not publish (the broker refused them), with the reason."""
        return f"{self.outbox}_dead_letter"

    @property
    def qualified_dead_letter(self) -> str:
        return qualified_name(self.schema, self.dead_letter, field="outbox table (dead letters)")

    @property
    def relay_offset(self) -> str:
        """How far the relay (auto mode) has read CDC's records, per topic partition."""
        return f"{self.outbox}_relay_offset"

    @property
    def qualified_relay_offset(self) -> str:
        return qualified_name(self.schema, self.relay_offset, field="outbox table (offsets)")

    @property
    def relay_lease(self) -> str:
        """The relay's leadership: who leads, until when (renewed by the leader)."""
        return f"{self.outbox}_relay_lease"

    @property
    def qualified_relay_lease(self) -> str:
        return qualified_name(self.schema, self.relay_lease, field="outbox table (lease)")

    @property
    def topic_registry(self) -> str:
        """Every aggregate type seen, with its topic name's collision key (``.`` = ``_``)."""
        return f"{self.outbox}_topic"

    @property
    def qualified_topic_registry(self) -> str:
        return qualified_name(self.schema, self.topic_registry, field="outbox table (topics)")

    @property
    def topic_check_function(self) -> str:
        return f"{self.outbox}_check_topic"

    @property
    def qualified_topic_check_function(self) -> str:
        return qualified_name(self.schema, self.topic_check_function, field="function")

    @property
    def outbox_access(self) -> str:
        """Which aggregate types each role may write and read in the outbox (row-level
        security; ``*``: every type)."""
        return f"{self.outbox}_access"

    @property
    def qualified_outbox_access(self) -> str:
        return qualified_name(self.schema, self.outbox_access, field="outbox table (access)")

    @property
    def inbox_consumer(self) -> str:
        """Which role may use which consumer name in the inbox (row-level security)."""
        return f"{self.inbox}_consumer"

    @property
    def qualified_inbox_consumer(self) -> str:
        return qualified_name(self.schema, self.inbox_consumer, field="inbox table (consumers)")

    @property
    def inbox_dead_letter(self) -> str:
        """Records a consumer's handler kept failing on, with the reason."""
        return f"{self.inbox}_dead_letter"

    @property
    def qualified_inbox_dead_letter(self) -> str:
        return qualified_name(
            self.schema, self.inbox_dead_letter, field="inbox table (dead letters)"
        )

    @property
    def effect(self) -> str:
        """The side-effect ledger: one row per (consumer, event id, effect)."""
        return f"{self.inbox}_effect"

    @property
    def qualified_effect(self) -> str:
        return qualified_name(self.schema, self.effect, field="inbox table (effects)")

    @property
    def qualified_inbox(self) -> str:
        return qualified_name(self.schema, self.inbox, field="inbox table")

    @property
    def qualified_position_sequence(self) -> str:
        return qualified_name(self.schema, self.position_sequence, field="sequence")

    @property
    def qualified_position_function(self) -> str:
        return qualified_name(self.schema, self.position_function, field="function")

    @property
    def quoted_schema(self) -> str:
        return quote_identifier(self.schema, field="schema")

    @property
    def quoted_publication(self) -> str:
        return quote_identifier(self.publication, field="publication")


def cdc_heartbeat_topic(topic_prefix: str, tables: OutboxTables) -> str:
    """The CDC heartbeat's topic: Debezium's change events of the heartbeat table, which the
    connector's heartbeat query writes to while the outbox is idle.

    The one place this name is made. The connector file's predicate keeps these records from
    the Event Router (outbox_connect.config renders it from here), and the relay in auto mode
    reads them as proof that CDC streams again (its default, from the same settings).
    """
    return f"{topic_prefix}.{tables.schema}.{tables.heartbeat}"
