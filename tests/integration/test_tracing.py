"""OpenTelemetry on the real stack: an event published inside a service's span keeps that
trace through PostgreSQL, the polling relay (whose batch span links to it) and Kafka, and
the consumer's span, with the handler's own work under it, is in the service's trace; the
lake job's batch span links to it too. Spans are read back from the SDK's in-memory exporter
(tests/otel_spans.py)."""

from __future__ import annotations

import uuid
from pathlib import Path

import sqlalchemy as sa
from kafka import KafkaProducer
from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from sqlalchemy.orm import Session

from outbox import Event, Outbox
from outbox.consumer import IdempotentConsumer, ReceivedEvent
from outbox.core.contract import topic_for
from outbox.tracing import traceparent_of
from tests.fix_lake import ingested, lake_env, rows
from tests.fix_relay import RelayBench, wait_until
from tests.integration.test_consumer import FAST_GROUP, drain
from tests.kafka_read import read_until
from tests.otel_spans import traced


def test_one_trace_from_the_service_through_the_relay_to_the_consumer(
    relay_bench: RelayBench,
) -> None:
    with traced() as spans:
        _one_trace(relay_bench, spans)


def _one_trace(relay_bench: RelayBench, spans: InMemorySpanExporter) -> None:
    aggregate_type = f"tr{uuid.uuid4().hex[:10]}"
    topic = topic_for(aggregate_type)
    bootstrap = relay_bench.kafka.bootstrap_servers
    service = trace.get_tracer("order-service")
    with service.start_as_current_span("place order") as placing:
        with relay_bench.database.connect() as connection, connection.transaction():
            event = Event(aggregate_type, "o-1", "OrderPlaced", {"total": 3})
            Outbox().publish(connection, event)
    trace_id = placing.get_span_context().trace_id
    (produced,) = [s for s in spans.get_finished_spans() if s.kind is SpanKind.PRODUCER]
    assert produced.context.trace_id == trace_id
    assert produced.attributes is not None
    assert produced.attributes["messaging.message.id"] == str(event.event_id)

    with relay_bench.in_thread():
        wait_until(lambda: relay_bench.undelivered() == 0, timeout=60, what="relayed")
    (record,) = read_until(bootstrap, topic, lambda r: len(r) >= 1, timeout=60)
    # the relay's batch span links to the event's context
    sent = [s for s in spans.get_finished_spans() if s.name == "send"]
    linked = [
        s for s in sent if any(link.context.span_id == produced.context.span_id for link in s.links)
    ]
    assert len(linked) == 1, sent
    assert linked[0].kind is SpanKind.CLIENT  # its context is no record's creation context
    assert linked[0].attributes is not None and linked[0].attributes["outbox.delivered"] == 1
    assert dict(record.headers)["traceparent"].decode() == traceparent_of(produced)  # type: ignore[arg-type]
    # a second copy, as a relay/CDC handover would deliver it
    producer = KafkaProducer(bootstrap_servers=bootstrap)
    producer.send(topic, key=record.key, value=record.value, headers=record.headers)
    producer.flush()
    producer.close()

    engine = sa.create_engine(relay_bench.database.url)
    handling = trace.get_tracer("billing")

    def handler(session: Session, received: ReceivedEvent) -> None:
        with handling.start_as_current_span("bill order"):
            session.execute(sa.text("SELECT 1"))

    consumer = IdempotentConsumer(
        name="traced",
        group_id=f"traced-{uuid.uuid4().hex[:8]}",
        topics=[topic],
        bootstrap_servers=bootstrap,
        begin=sa.orm.sessionmaker(engine).begin,
        handler=handler,
        consumer_options=FAST_GROUP,
    )
    try:
        drain(consumer, lambda: consumer.stats.applied + consumer.stats.duplicates >= 2)
    finally:
        consumer.close()
        engine.dispose()
    processed = [s for s in spans.get_finished_spans() if s.kind is SpanKind.CONSUMER]
    assert [s.attributes["outbox.outcome"] for s in processed if s.attributes] == [
        "handled",
        "duplicate",
    ]
    for span in processed:
        assert span.context.trace_id == trace_id
        assert span.parent is not None and span.parent.span_id == produced.context.span_id
        assert span.name == f"process {topic}"
    (billed,) = [s for s in spans.get_finished_spans() if s.name == "bill order"]
    assert billed.parent is not None and billed.parent.span_id == processed[0].context.span_id


def test_the_lake_job_s_batch_span_links_to_the_events_it_landed(
    relay_bench: RelayBench, tmp_path: Path
) -> None:
    prefix = f"lt{uuid.uuid4().hex[:8]}"
    with traced() as spans:
        service = trace.get_tracer("order-service")
        with service.start_as_current_span("place orders"):
            with relay_bench.database.connect() as connection, connection.transaction():
                Outbox().publish_many(
                    connection, [Event(prefix, str(n), "OrderPlaced", {"n": n}) for n in range(3)]
                )
        produced = {
            s.context.span_id for s in spans.get_finished_spans() if s.kind is SpanKind.PRODUCER
        }
        assert len(produced) == 3
        with relay_bench.in_thread():
            wait_until(lambda: relay_bench.undelivered() == 0, timeout=60, what="relayed")
        lake = tmp_path / "lake"
        ingested(lake_env(lake, prefix, relay_bench.kafka.bootstrap_servers))
        batches = [s for s in spans.get_finished_spans() if s.name == "process outbox lake"]
    assert len(rows(lake, "events")) == 3
    landed = [s for s in batches if s.attributes and s.attributes["outbox.lake.events_landed"]]
    assert len(landed) == 1, batches
    (batch,) = landed
    assert batch.kind is SpanKind.CONSUMER
    assert batch.attributes is not None and batch.attributes["outbox.lake.events_landed"] == 3
    assert {link.context.span_id for link in batch.links} == produced
