"""OpenTelemetry spans of the SDK, by the messaging semantic conventions (optional).

With ``opentelemetry-api`` installed (``pip install 'outbox-relay[tracing]'``) and an
OpenTelemetry SDK configured by the application (``OTEL_*`` variables, an OTLP exporter),
the SDK emits:

- ``create <topic>``, kind PRODUCER, one per event ``publish``/``publish_many`` writes
  without a ``traceparent``, as a child of the caller's current span. Its context becomes
  the event's ``traceparent`` (its creation context), so CDC and the relay carry it unchanged
  to Kafka and the lake. An event the caller gave a ``traceparent`` has no such span: by the
  messaging conventions a creation context the user provides is kept as it is and no
  "create" span is made for it (one would name a context no record carries);
- ``send``, kind CLIENT, one per batch the polling relay sends (the relay is yours to
  instrument: ``opentelemetry-instrument outbox relay run``), linked to the events' creation
  contexts (the first :data:`MAX_LINKS` of the batch), with the counts delivered, retried
  and rejected. CLIENT, not PRODUCER: its context is never a record's creation context (a
  copy the relay sends must equal the one CDC sends, so it carries the stored
  ``traceparent``, not the relay's). A batch that fails (not acknowledged, a broker error)
  ends it with an error status;
- ``process outbox lake``, kind CONSUMER, one per micro-batch of the lake job (run under
  ``opentelemetry-instrument outbox lake ingest``), with its records, events landed,
  duplicates and records set aside, linked to a sample of the events it landed;
- ``process <topic>``, kind CONSUMER, one per record :class:`~outbox.IdempotentConsumer`
  handles, a child of the context in the record's ``traceparent``, with the outcome
  (``outbox.outcome``: ``handled``, ``duplicate``, ``dead-lettered``, or ``parked`` when
  the handler handled it but an effect step of the ledger was parked for a decision); the
  handler runs inside it, so its own spans (database calls) are the event's too. Each
  :class:`~outbox.Effects` step the handler performs is an event ``outbox.effect`` on it
  (the effect, its state, whether this call made it); ``parked`` counts the attempt that
  succeeded only, not one that failed and was retried.

A failure is recorded by its type only (``error.type`` and the status): an error's text may
quote a payload or a row, which traces must not carry.

Without ``opentelemetry-api``, or with the API alone (no SDK: every span is a no-op), nothing
is emitted, no ``traceparent`` is invented, and a publish costs one check.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from collections.abc import Iterator, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from outbox.core.contract import topic_for
from outbox.core.event import Event

if TYPE_CHECKING:
    from opentelemetry.trace import Span, SpanContext, Tracer

    from outbox.core.effects import EffectOutcome
    from outbox.core.kafka_record import KafkaRecord

__all__ = [
    "CONSUMER_OUTCOMES",
    "MAX_LINKS",
    "Processing",
    "creates_spans",
    "creating",
    "landing",
    "link",
    "performed",
    "processing",
    "recording",
    "sending",
    "traceparent_of",
]

SYSTEM = "kafka"
CONSUMER_OUTCOMES = ("handled", "duplicate", "dead-lettered", "parked")
MAX_LINKS = 128
"""Links a batch's span carries at most (a trace backend keeps a bounded number anyway)."""


@functools.cache
def _tracer() -> Tracer | None:
    """The SDK's tracer, or None without ``opentelemetry-api``. (The API hands out a proxy:
    an SDK the application configures later is used from then on.)"""
    try:
        from opentelemetry import trace
    except ImportError:
        return None
    return trace.get_tracer("outbox")


def creates_spans() -> bool:
    """Whether :func:`creating` could start a span or give an event a ``traceparent`` now.

    False without ``opentelemetry-api``, and with the API's own tracer while no SDK is
    configured and no span is current: then ``creating`` would yield the events as they
    are. A publish asks this first and skips ``creating`` when False: building the one
    no-op span that finds it out cost half of the SDK's Python per publish
    (benchmarks/notes.md)."""
    tracer = _tracer()
    if tracer is None:
        return False
    from opentelemetry import trace

    if not isinstance(tracer, trace.ProxyTracer):
        return True  # an SDK's tracer (configured before ours was made), or one given to us
    # The global the API's proxy tracer itself reads to find an SDK (get_tracer_provider()
    # looks the environment up on every call: a third of this check's time). Should the
    # API rename it, the public call decides.
    provider = getattr(trace, "_TRACER_PROVIDER", _UNKNOWN)
    if provider is _UNKNOWN:
        provider = trace.get_tracer_provider()
        provider = None if isinstance(provider, trace.ProxyTracerProvider) else provider
    return provider is not None or trace.get_current_span().get_span_context().is_valid


_UNKNOWN = object()


def traceparent_of(span: Span) -> str | None:
    """``span``'s context as a W3C ``traceparent`` (None: the span has no valid context)."""
    context = span.get_span_context()
    if not context.is_valid:
        return None
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"


@contextlib.contextmanager
def creating(events: Sequence[Event]) -> Iterator[list[Event]]:
    """A PRODUCER span per event without a ``traceparent`` for the block that writes them,
    a child of the current span; yields the events, those given their span's context as
    ``traceparent``. An event that has one (the caller's creation context) is yielded as it
    is, with no span of ours. A failure of the block is recorded on each span (error
    status) and raised."""
    tracer = _tracer()
    if tracer is None:
        yield list(events)
        return
    from opentelemetry.trace import SpanKind

    if not all(isinstance(event, Event) for event in events):
        yield list(events)  # the write refuses them, with its own error
        return
    spans: list[Span] = []
    traced = []
    for event in events:
        if event.traceparent is not None:
            traced.append(event)  # the caller's creation context: kept, and no span for it
            continue
        topic = topic_for(event.aggregate_type)
        span = tracer.start_span(
            f"create {topic}",
            kind=SpanKind.PRODUCER,
            attributes={
                "messaging.system": SYSTEM,
                "messaging.operation.type": "create",
                "messaging.operation.name": "publish",
                "messaging.destination.name": topic,
                "messaging.message.id": str(event.event_id),
                "messaging.kafka.message.key": event.aggregate_id,
                "outbox.aggregate.type": event.aggregate_type,
                "outbox.aggregate.id": event.aggregate_id,
                "outbox.event.type": event.event_type,
            },
        )
        if not spans and not span.is_recording() and traceparent_of(span) is None:
            span.end()  # no SDK and no trace in hand: no span, no traceparent, no cost
            yield list(events)
            return
        spans.append(span)
        traced.append(_with(event, traceparent_of(span)))
    try:
        yield traced
    except BaseException as error:
        for span in spans:
            _failed(span, error)
        raise
    finally:
        for span in spans:
            span.end()


def _with(event: Event, traceparent: str | None) -> Event:
    return replace(event, traceparent=traceparent)


_PARKED: contextvars.ContextVar[list[str] | None] = contextvars.ContextVar(
    "outbox_parked_effects", default=None
)
"""The effects parked while the record in hand was processed (None: no record in hand)."""


class Processing:
    """What :func:`processing` yields: set the record's outcome before the block ends."""

    def __init__(self, span: Span | None, parked: list[str] | None = None) -> None:
        self.span = span
        self.parked = parked if parked is not None else []

    def attempt(self) -> None:
        """A new attempt at the record: what an earlier, failed attempt parked does not
        count. The outcome is the attempt whose transaction commits; a step still parked
        in the ledger is reported again when that attempt performs it."""
        self.parked.clear()

    def outcome(self, outcome: str, *, event_id: str | None = None) -> None:
        if self.span is None:
            return
        if outcome == "handled" and self.parked:
            outcome = "parked"
        self.span.set_attribute("outbox.outcome", outcome)
        if event_id is not None:
            self.span.set_attribute("messaging.message.id", event_id)


@contextlib.contextmanager
def processing(
    record: KafkaRecord,
    *,
    consumer: str,
    group: str,
    stops: tuple[type[BaseException], ...] = (),
) -> Iterator[Processing]:
    """A CONSUMER span, current for the block, child of the record's ``traceparent``. An
    error the block raises is recorded on it (its type: error status), except ``stops``:
    the consumer's own control flow (leaving the record on shutdown), which is no failure."""
    tracer = _tracer()
    if tracer is None:
        yield Processing(None)
        return
    from opentelemetry.trace import SpanKind
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    carrier = {
        name: value.decode("ascii", "replace")
        for name, value in record.headers
        if name == "traceparent" and value
    }
    parent = TraceContextTextMapPropagator().extract(carrier) if carrier else None
    attributes: dict[str, Any] = {
        "messaging.system": SYSTEM,
        "messaging.operation.type": "process",
        "messaging.operation.name": "process",
        "messaging.destination.name": record.topic,
        "messaging.destination.partition.id": str(record.partition),
        "messaging.kafka.offset": record.offset,
        "messaging.consumer.group.name": group,
        "outbox.consumer": consumer,
    }
    parked: list[str] = []
    token = _PARKED.set(parked)
    try:
        with tracer.start_as_current_span(
            f"process {record.topic}",
            context=parent,
            kind=SpanKind.CONSUMER,
            attributes=attributes,
            record_exception=False,  # an error's text may quote a payload: its type only
            set_status_on_exception=False,
        ) as span:
            try:
                yield Processing(span, parked)
            except stops:
                raise  # leaving, not failing: the record comes again
            except BaseException as error:
                _failed(span, error)
                raise
    finally:
        _PARKED.reset(token)


def performed(outcome: EffectOutcome) -> EffectOutcome:
    """Record an effect step's outcome on the current span (an event ``outbox.effect``),
    and a parked one for the consumer's outcome; ``outcome`` is returned as it is."""
    if _tracer() is None:
        return outcome
    from opentelemetry import trace

    span = trace.get_current_span()
    if span.is_recording():
        span.add_event(
            "outbox.effect",
            {
                "outbox.effect.name": outcome.step.effect,
                "outbox.effect.state": outcome.state.value,
                "outbox.effect.called": outcome.called,
            },
        )
    parked = _PARKED.get()
    if parked is not None and outcome.needs_decision:
        parked.append(outcome.step.effect)
    return outcome


@contextlib.contextmanager
def sending(traceparents: Sequence[bytes]) -> Iterator[Span | None]:
    """A CLIENT span ``send`` for a batch of records, current for the block, linked to the
    creation contexts in the ``traceparents`` (W3C, as the outbox stores them; empty: none)
    of its first :data:`MAX_LINKS` records; None without ``opentelemetry-api``. CLIENT, as
    the messaging conventions have a "send" span whose context is no record's creation
    context (the records carry their events' own). An error the block raises (the batch
    failed) is recorded on it by its type."""
    with _batch("send", "send", len(traceparents)) as span:
        if span is not None:
            link(span, traceparents)
        yield span


@contextlib.contextmanager
def landing() -> Iterator[Span | None]:
    """A CONSUMER span ``process outbox lake`` for one micro-batch of the lake job, current
    for the block (the caller adds its counts, and links a sample of its events: :func:`link`);
    None without ``opentelemetry-api``. An error the block raises is recorded by its type."""
    with _batch("process", "process outbox lake", None) as span:
        yield span


@contextlib.contextmanager
def _batch(operation: str, name: str, count: int | None) -> Iterator[Span | None]:
    tracer = _tracer()
    if tracer is None:
        yield None
        return
    from opentelemetry.trace import SpanKind

    attributes: dict[str, Any] = {
        "messaging.system": SYSTEM,
        "messaging.operation.type": operation,
        "messaging.operation.name": operation,
    }
    if count is not None:
        attributes["messaging.batch.message_count"] = count
    with tracer.start_as_current_span(
        name,
        kind=SpanKind.CLIENT if operation == "send" else SpanKind.CONSUMER,
        attributes=attributes,
        record_exception=False,  # an error's text may quote a payload: its type only
        set_status_on_exception=False,
    ) as span:
        try:
            yield span
        except BaseException as error:
            _failed(span, error)
            raise


def recording(span: Span | None) -> bool:
    """Whether an SDK records ``span`` (what is only worth computing for it)."""
    return span is not None and span.is_recording()


def link(span: Span, traceparents: Sequence[bytes | str]) -> None:
    """Link ``span`` to the contexts of the first :data:`MAX_LINKS` ``traceparents`` (when
    an SDK records it: with none, nothing is parsed)."""
    if not span.is_recording():
        return
    for traceparent in traceparents[:MAX_LINKS]:
        context = _context_of(traceparent)
        if context is not None:
            span.add_link(context)


def _context_of(traceparent: bytes | str) -> SpanContext | None:
    """The span context a stored ``traceparent`` names, or None (none, or not W3C)."""
    if not traceparent:
        return None
    if isinstance(traceparent, bytes):
        traceparent = traceparent.decode("ascii", "replace")
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    carrier = {"traceparent": traceparent}
    context = trace.get_current_span(TraceContextTextMapPropagator().extract(carrier))
    found = context.get_span_context()
    return found if found.is_valid else None


def _failed(span: Span, error: BaseException) -> None:
    from opentelemetry.trace import Status, StatusCode

    # the type only: an error's text may quote a payload or a row, which traces must not carry
    span.set_attribute("error.type", type(error).__name__)
    span.set_status(Status(StatusCode.ERROR, type(error).__name__))
