"""The SDK's OpenTelemetry spans (outbox.tracing), with the OpenTelemetry SDK's in-memory
exporter: a PRODUCER span per published event whose context becomes the event's
traceparent, a CONSUMER span per handled record in the trace of that traceparent. (Pure: no
database or broker.)"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from outbox import Event
from outbox.core.contract import record_for
from outbox.core.effects import EffectOutcome, EffectStep, StepState
from outbox.core.kafka_record import KafkaRecord
from outbox.tracing import creating, performed, processing, traceparent_of
from tests.otel_spans import traced


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


def test_a_traceparent_the_caller_gave_is_kept(spans: InMemorySpanExporter) -> None:
    given = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    with creating([_event(traceparent=given)]) as traced:
        pass
    assert traced[0].traceparent == given
    assert len(spans.get_finished_spans()) == 1


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
