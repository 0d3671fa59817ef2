"""What reconcile keeps of each thing it reads, and the time window. (Pure: stdlib only.)

Invariants:

- a Kafka record is reduced to its identity (event id, aggregate, position) and its place
  (topic, partition, offset); a record without a readable ``id`` header is *malformed* (the
  lake quarantines it, and reports it there);
- an event's time is the one its UUIDv7 id carries (what the lake's ``event_time`` and
  ``event_date`` hold), so the outbox, Kafka and the lake are filtered by the same clock
  whatever the delays between them; ids of other versions have the epoch as their time.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from outbox.core.kafka_record import content_digest

__all__ = [
    "KafkaCopy",
    "Malformed",
    "Window",
    "copy_of",
    "earliest_copy_ms",
    "event_time_ms",
    "parse_moment",
]

TOPIC_PREFIX = "outbox.event."  # outbox.core.contract.TOPIC_PREFIX, without importing it


@dataclass(frozen=True, slots=True)
class KafkaCopy:
    """One record of an event on Kafka (an event may have several copies)."""

    event_id: str
    aggregate_type: str
    aggregate_id: str
    position: int | None
    topic: str
    partition: int
    offset: int
    timestamp_ms: int
    digest: str | None = None
    """Of the record's key, value and headers (None when the value was not read): two
    copies of one event id are duplicates only when their digests are equal."""


@dataclass(frozen=True, slots=True)
class Malformed:
    topic: str
    partition: int
    offset: int
    reason: str


def event_time_ms(event_id: str) -> int:
    """Milliseconds since the epoch carried by a UUIDv7 (0 for other versions or bad text)."""
    try:
        parsed = uuid.UUID(event_id)
    except ValueError:
        return 0
    return parsed.int >> 80 if parsed.version == 7 else 0


_CLOCKS_MARGIN_MS = 3_600_000


def earliest_copy_ms(built_ms: int) -> int:
    """The oldest Kafka timestamp a copy of an event built at ``built_ms`` may carry: a
    record is produced after its event was built, less an hour for the clocks of the
    application, the database and the producers to disagree. A read of the copies of events
    built since ``built_ms`` seeks there (``offsets_for_times``), not to the beginning."""
    return max(0, built_ms - _CLOCKS_MARGIN_MS)


def _position(value: bytes | None) -> int | None:
    if value is None or not value.isdigit() or len(value) > 19:
        return None
    number = int(value)
    return number if number < 2**63 else None


def copy_of(
    *,
    topic: str,
    partition: int,
    offset: int,
    timestamp_ms: int,
    key: bytes | None,
    headers: Sequence[tuple[str, bytes | None]],
    value: bytes | None = None,
) -> KafkaCopy | Malformed:
    """The identity of a record, read from its headers only (the payload is not parsed);
    with ``value``, the digest of its content too."""
    raw_id = next((value for name, value in headers if name == "id"), None)
    if raw_id is None:
        return Malformed(topic, partition, offset, "the record has no 'id' header")
    try:
        event_id = str(uuid.UUID(raw_id.decode("ascii")))
    except (UnicodeDecodeError, ValueError):
        return Malformed(topic, partition, offset, "the 'id' header is not a UUID")
    position = _position(next((value for name, value in headers if name == "position"), None))
    return KafkaCopy(
        event_id=event_id,
        aggregate_type=topic.removeprefix(TOPIC_PREFIX),
        aggregate_id=(key or b"").decode("utf-8", "replace"),
        position=position,
        topic=topic,
        partition=partition,
        offset=offset,
        timestamp_ms=timestamp_ms,
        digest=None if value is None else content_digest(key, value, headers),
    )


_RELATIVE = re.compile(r"^(\d+)\s*([smhd])$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}


def parse_moment(text: str, *, now: datetime | None = None) -> datetime:
    """``2026-11-23``, ``2026-11-23T10:00:00+01:00`` (no zone: UTC), or a duration ago
    (``90m``, ``24h``, ``7d``); ValueError with an example otherwise."""
    match = _RELATIVE.match(text.strip())
    if match:
        amount, unit = int(match.group(1)), _UNITS[match.group(2)]
        return (now or datetime.now(UTC)) - timedelta(**{unit: amount})
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(
            f"{text!r} is not a time: use ISO 8601 (2026-11-23T10:00:00Z) or a duration ago "
            "(90m, 24h, 7d)"
        ) from None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


@dataclass(frozen=True, slots=True)
class Window:
    """Events whose id time is in ``[since, until)``; ``None``: unbounded on that side."""

    since: datetime | None = None
    until: datetime | None = None

    def __post_init__(self) -> None:
        if self.since and self.until and self.since >= self.until:
            raise ValueError("--since must be before --until")

    @property
    def since_ms(self) -> int | None:
        return None if self.since is None else int(self.since.timestamp() * 1000)

    @property
    def until_ms(self) -> int | None:
        return None if self.until is None else int(self.until.timestamp() * 1000)

    def holds(self, event_id: str) -> bool:
        if self.since is None and self.until is None:
            return True
        return self.holds_ms(event_time_ms(event_id))

    def holds_ms(self, moment_ms: int) -> bool:
        since, until = self.since_ms, self.until_ms
        return (since is None or moment_ms >= since) and (until is None or moment_ms < until)

    def describe(self) -> str:
        if self.since is None and self.until is None:
            return "all events"
        since = self.since.isoformat() if self.since else "the first event"
        until = self.until.isoformat() if self.until else "now"
        return f"events from {since} until {until} (by the time in their UUIDv7 id)"
