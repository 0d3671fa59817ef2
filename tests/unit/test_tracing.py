"""The SDK's OpenTelemetry spans (outbox.tracing), with the OpenTelemetry SDK's in-memory
exporter: a PRODUCER span per published event whose context becomes the event's
traceparent (none for an event the caller gave one), a CONSUMER span per handled record in
the trace of that traceparent, the relay's CLIENT span per batch. (Pure: no database or
broker; the consumer and the relay's sender run with a scripted reader and producer.)"""

from __future__ import annotations

import contextlib
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kafka.errors import KafkaConnectionError
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

import outbox.consumer
from outbox import Event
from outbox.consumer import IdempotentConsumer, ReceivedEvent
from outbox.core.contract import record_for
from outbox.core.effects import EffectOutcome, EffectStep, StepState
from outbox.core.kafka_record import KafkaRecord
from outbox.core.protocol import Claim
from outbox.tracing import creates_spans, creating, performed, processing, traceparent_of
from outbox_relay.database import OutboxRow
from outbox_relay.horizon import Horizon
from outbox_relay.metrics import RelayMetrics
from outbox_relay.producer import BatchOutcome
from outbox_relay.sender import BatchNotAcknowledged, Sender
from outbox_relay.settings import RelaySettings
from tests.otel_spans import traced

GIVEN = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
"""A creation context a caller gives an event (W3C traceparent)."""


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    with traced() as exporter:
        yield exporter


def test_with_the_sdk_off_no_traceparent_is_invented() -> None:
    with traced():
        pass  # the process's provider is the tests' from here on, off outside `traced`
    with creating([_event()]) as events:
        pass
    assert events[0].traceparent is None


def test_with_no_sdk_and_no_current_span_a_publish_skips_creating_and_loses_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``creates_spans()`` says False exactly where ``creating`` would yield the events as
    they are: the API's own tracer, no SDK, no current span. A current span's context (a
    caller propagating a trace without an SDK) still reaches the event."""
    monkeypatch.setattr(trace, "_TRACER_PROVIDER", None)
    monkeypatch.setattr("outbox.tracing._tracer", lambda: trace.ProxyTracer("outbox"))
    given = [_event(), _event(traceparent=GIVEN)]
    assert not creates_spans()
    with creating(given) as events:
        assert events == given
    context = trace.SpanContext(
        int(GIVEN.split("-")[1], 16), int(GIVEN.split("-")[2], 16), is_remote=True
    )
    with trace.use_span(trace.NonRecordingSpan(context)):
        assert creates_spans()
        with creating([_event()]) as events:
            assert events[0].traceparent is not None
            assert events[0].traceparent.split("-")[1] == GIVEN.split("-")[1]


def _event(**changes: object) -> Event:
    return Event("tracedorder", "o-1", "OrderPlaced", {"total": 3}, **changes)  # type: ignore[arg-type]


def test_each_event_gets_a_producer_span_under_the_caller_s_span_and_its_traceparent(
    spans: InMemorySpanExporter,
) -> None:
    tracer = trace.get_tracer("the-service")
    with tracer.start_as_current_span("place order") as service:
        with creating([_event(), _event()]) as traced:
            pass
    produced = [s for s in spans.get_finished_spans() if s.kind is SpanKind.PRODUCER]
    assert len(produced) == 2
    for span, event in zip(produced, traced, strict=True):
        assert span.name == "create outbox.event.tracedorder"
        assert span.parent is not None
        assert span.parent.span_id == service.get_span_context().span_id
        assert span.context.trace_id == service.get_span_context().trace_id
        assert span.attributes is not None
        assert span.attributes["messaging.system"] == "kafka"
        assert span.attributes["messaging.destination.name"] == "outbox.event.tracedorder"
        assert span.attributes["messaging.message.id"] == str(event.event_id)
        assert span.attributes["outbox.aggregate.id"] == "o-1"
        assert event.traceparent == traceparent_of(span)  # type: ignore[arg-type]


def test_a_traceparent_the_caller_gave_is_kept_and_gets_no_create_span(
    spans: InMemorySpanExporter,
) -> None:
    """The messaging conventions: a creation context the user provides is not modified and
    no "create" span is made for it (its span would be in no trace a consumer follows)."""
    tracer = trace.get_tracer("the-service")
    with tracer.start_as_current_span("forward order") as service:
        with creating([_event(traceparent=GIVEN), _event()]) as traced:
            pass
    given, own = traced
    assert given.traceparent == GIVEN
    (created,) = [s for s in spans.get_finished_spans() if s.kind is SpanKind.PRODUCER]
    assert created.attributes is not None
    assert created.attributes["messaging.message.id"] == str(own.event_id)
    assert created.parent is not None
    assert created.parent.span_id == service.get_span_context().span_id
    assert own.traceparent == traceparent_of(created)  # type: ignore[arg-type]
    # the consumer's span of the given event is in the caller's trace, under its context
    with processing(_record(GIVEN), consumer="billing", group="g") as span:
        span.outcome("handled")
    consumer = next(s for s in spans.get_finished_spans() if s.kind is SpanKind.CONSUMER)
    assert consumer.context.trace_id == int(GIVEN.split("-")[1], 16)
    assert consumer.parent is not None and consumer.parent.span_id == int(GIVEN.split("-")[2], 16)


def test_with_the_sdk_off_a_given_traceparent_costs_no_span(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with traced():
        pass  # the process's provider is the tests' from here on, off outside `traced`
    started: list[object] = []
    tracer = trace.get_tracer("outbox")
    monkeypatch.setattr("outbox.tracing._tracer", lambda: _Counting(tracer, started), raising=True)
    with creating([_event(traceparent=GIVEN), _event(traceparent=GIVEN)]) as events:
        pass
    assert [event.traceparent for event in events] == [GIVEN, GIVEN]
    assert started == []


class _Counting:
    """A tracer that counts the spans started through it."""

    def __init__(self, tracer: trace.Tracer, started: list[object]) -> None:
        self._tracer = tracer
        self._started = started

    def start_span(self, *args: Any, **kwargs: Any) -> trace.Span:
        self._started.append(args)
        return self._tracer.start_span(*args, **kwargs)


def test_a_failed_write_marks_every_event_s_span(spans: InMemorySpanExporter) -> None:
    with pytest.raises(RuntimeError), creating([_event(), _event()]):
        raise RuntimeError("the insert failed")
    finished = spans.get_finished_spans()
    assert len(finished) == 2
    assert all(s.status.status_code is StatusCode.ERROR for s in finished)


def _record(traceparent: str) -> KafkaRecord:
    event = _event()
    built = record_for(
        event_id=event.event_id,
        aggregate_type=event.aggregate_type,
        aggregate_id=event.aggregate_id,
        event_type=event.event_type,
        payload_text='{"total": 3}',
        headers_text="{}",
        traceparent=traceparent,
        position=7,
    )
    return KafkaRecord(
        topic=built.topic,
        partition=0,
        offset=41,
        timestamp_ms=0,
        key=built.key,
        value=built.value,
        headers=list(built.headers),
    )


def test_the_consumer_s_span_is_in_the_trace_of_the_record_s_traceparent(
    spans: InMemorySpanExporter,
) -> None:
    with creating([_event()]) as traced:
        pass
    (producer,) = spans.get_finished_spans()
    assert traced[0].traceparent is not None
    inner = trace.get_tracer("the-handler")
    with processing(_record(traced[0].traceparent), consumer="billing", group="g") as span:
        with inner.start_as_current_span("apply"):
            pass
        span.outcome("handled", event_id="e-1")
    consumer = next(s for s in spans.get_finished_spans() if s.kind is SpanKind.CONSUMER)
    applied = next(s for s in spans.get_finished_spans() if s.name == "apply")
    assert consumer.name == "process outbox.event.tracedorder"
    assert consumer.context.trace_id == producer.context.trace_id
    assert consumer.parent is not None and consumer.parent.span_id == producer.context.span_id
    assert applied.parent is not None and applied.parent.span_id == consumer.context.span_id
    assert consumer.attributes is not None
    assert consumer.attributes["outbox.outcome"] == "handled"
    assert consumer.attributes["messaging.kafka.offset"] == 41
    assert consumer.attributes["messaging.consumer.group.name"] == "g"


def test_a_record_without_traceparent_starts_a_trace_of_its_own(
    spans: InMemorySpanExporter,
) -> None:
    with processing(_record(""), consumer="billing", group="g") as span:
        span.outcome("duplicate")
    (consumer,) = spans.get_finished_spans()
    assert consumer.parent is None
    assert consumer.attributes is not None and consumer.attributes["outbox.outcome"] == "duplicate"


def _outcome(state: StepState) -> EffectOutcome:
    step = EffectStep(
        consumer="billing",
        event_id="e-1",
        effect="charge",
        idempotency_key=uuid.uuid4(),
        attempt=1,
        context=None,
    )
    return EffectOutcome(step=step, state=state, reference=None, called=False)


def test_an_effect_parked_by_the_handler_makes_the_record_s_outcome_parked(
    spans: InMemorySpanExporter,
) -> None:
    with processing(_record(""), consumer="billing", group="g") as span:
        performed(_outcome(StepState.DONE))
        performed(_outcome(StepState.NEEDS_DECISION))
        span.outcome("handled")
    with processing(_record(""), consumer="billing", group="g") as span:
        performed(_outcome(StepState.DONE))
        span.outcome("handled")
    parked, handled = spans.get_finished_spans()
    assert parked.attributes is not None and parked.attributes["outbox.outcome"] == "parked"
    assert handled.attributes is not None and handled.attributes["outbox.outcome"] == "handled"
    states = [e.attributes["outbox.effect.state"] for e in parked.events if e.attributes]
    assert states == ["done", "needs_decision"]
    assert performed(_outcome(StepState.NEEDS_DECISION)).needs_decision  # no record in hand


def test_an_effect_parked_by_a_failed_attempt_does_not_make_the_record_parked(
    spans: InMemorySpanExporter, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first attempt parks a step and fails; the retry performs it and commits: the
    record was handled (the failed attempt's effect stays an event on the span)."""
    attempts: list[ReceivedEvent] = []

    def handler(transaction: None, event: ReceivedEvent) -> None:
        attempts.append(event)
        if len(attempts) == 1:
            performed(_outcome(StepState.NEEDS_DECISION))
            raise RuntimeError("the handler failed after parking")
        performed(_outcome(StepState.DONE))

    consumer = _consumer(monkeypatch, handler)
    assert consumer.poll_once(timeout_seconds=0) == 1
    (processed,) = spans.get_finished_spans()
    assert len(attempts) == 2
    assert processed.attributes is not None
    assert processed.attributes["outbox.outcome"] == "handled"
    states = [e.attributes["outbox.effect.state"] for e in processed.events if e.attributes]
    assert states == ["needs_decision", "done"]


def test_a_consumer_stopped_while_waiting_to_retry_records_no_error(
    spans: InMemorySpanExporter, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stopping leaves the record for after a restart: it is no failure of its span."""
    stop = threading.Event()

    def handler(transaction: None, event: ReceivedEvent) -> None:
        stop.set()  # the stop comes while the consumer waits to try again
        raise RuntimeError("the handler failed once")

    consumer = _consumer(monkeypatch, handler)
    consumer.run(stop)
    (processed,) = spans.get_finished_spans()
    assert processed.kind is SpanKind.CONSUMER
    assert processed.status.status_code is StatusCode.UNSET
    assert processed.attributes is not None and "error.type" not in processed.attributes
    assert not processed.events


class _Reader:
    """The consumer's Kafka reader, scripted: one record, then nothing."""

    def __init__(self, records: list[KafkaRecord]) -> None:
        self.records = records

    def subscribe(self, topics: object, pattern: object) -> None:
        pass

    def poll(self, timeout_seconds: float) -> list[KafkaRecord]:
        records, self.records = self.records, []
        return records

    def commit(self) -> None:
        pass

    def close(self) -> None:
        pass


def _consumer(monkeypatch: pytest.MonkeyPatch, handler: Any) -> IdempotentConsumer[None]:
    reader = _Reader([_record("")])
    monkeypatch.setattr(outbox.consumer, "KafkaReader", lambda settings, role: reader)
    consumer: IdempotentConsumer[None] = IdempotentConsumer(
        name="billing",
        group_id="g",
        bootstrap_servers="127.0.0.1:9",
        topics=["outbox.event.tracedorder"],
        begin=lambda: contextlib.nullcontext(None),
        handler=handler,
        retry_backoff_seconds=0.0,
    )
    # every claim is new: the inbox is the database's, which these tests have none of
    monkeypatch.setattr(consumer, "_claim", lambda transaction, event, digest: Claim.NEW)
    return consumer


def _row(traceparent: str) -> OutboxRow:
    return OutboxRow(
        str(uuid.uuid4()), "tracedorder", b"o-1", b"OrderPlaced", b'{"card": "4111"}', b"{}",
        traceparent.encode(), 7,
    )  # fmt: skip


class _Producer:
    """The relay's producer, scripted: an outcome, or an error raised."""

    def __init__(self, answer: BatchOutcome | Exception) -> None:
        self.answer = answer

    def publish(self, rows: list[OutboxRow]) -> BatchOutcome:
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer

    def close(self) -> None:
        pass


def _send(answer: BatchOutcome | Exception, rows: list[OutboxRow]) -> None:
    sender = Sender(
        "127.0.0.1:9",
        RelaySettings(),
        metrics=RelayMetrics(),
        horizon=Horizon(),
        check_lease=lambda: None,
    )
    sender._producer = _Producer(answer)  # type: ignore[assignment]
    sender.publish(rows)


def test_the_relay_s_send_span_is_a_client_span_linked_to_the_creation_contexts(
    spans: InMemorySpanExporter,
) -> None:
    """Its context is no record's creation context (the records carry their events' own),
    so by the messaging conventions it is CLIENT, not PRODUCER."""
    rows = [_row(GIVEN), _row("")]
    _send(BatchOutcome(delivered=[row.id for row in rows]), rows)
    (sent,) = spans.get_finished_spans()
    assert sent.name == "send"
    assert sent.kind is SpanKind.CLIENT
    assert sent.status.status_code is StatusCode.UNSET
    assert [link.context.span_id for link in sent.links] == [int(GIVEN.split("-")[2], 16)]
    assert sent.attributes is not None
    assert sent.attributes["messaging.operation.type"] == "send"
    assert sent.attributes["messaging.batch.message_count"] == 2
    assert sent.attributes["outbox.delivered"] == 2


NOT_ACKNOWLEDGED = BatchOutcome(failure="KafkaTimeoutError: no answer for {'card': '4111'}")


@pytest.mark.parametrize(
    ("answer", "error_type"),
    [
        (NOT_ACKNOWLEDGED, "BatchNotAcknowledged"),
        (KafkaConnectionError("the broker dropped {'card': '4111'}"), "KafkaConnectionError"),
    ],
    ids=["not acknowledged", "broker error"],
)
def test_a_failed_batch_ends_the_send_span_with_an_error_by_its_type_only(
    spans: InMemorySpanExporter, answer: BatchOutcome | Exception, error_type: str
) -> None:
    with pytest.raises((BatchNotAcknowledged, KafkaConnectionError)):
        _send(answer, [_row(GIVEN)])
    (sent,) = spans.get_finished_spans()
    assert sent.kind is SpanKind.CLIENT
    assert sent.status.status_code is StatusCode.ERROR
    assert sent.status.description == error_type
    assert sent.attributes is not None and sent.attributes["error.type"] == error_type
    assert not sent.events  # no exception event: its text may quote a record
    assert "4111" not in _everything(sent)


def _everything(span: ReadableSpan) -> str:
    return span.to_json()
