"""The spans of one event exported over OTLP to a real tracing backend (Jaeger all-in-one,
built from the Go module proxy by the stack, on loopback) and read back from its API: the
service's trace holds the producer span and the consumer's, each a child of the one before;
the relay's batch span, in a trace of its own, refers to the event's producer span."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.trace import SpanKind

from outbox import Event, Outbox
from outbox.consumer import IdempotentConsumer
from outbox.core.contract import topic_for
from outbox_stack.jaeger import JaegerPorts, JaegerService, jaeger_binary
from tests.fix_postgres import ROOT, free_port
from tests.fix_relay import RelayBench, wait_until
from tests.integration.test_consumer import FAST_GROUP, drain
from tests.otel_spans import traced

pytestmark = pytest.mark.timeout(1500)  # the first run builds Jaeger (minutes)


@pytest.fixture(scope="module")
def jaeger(tmp_path_factory: pytest.TempPathFactory) -> Iterator[JaegerService]:
    binary = jaeger_binary(ROOT / ".cache" / "stack")
    ports = JaegerPorts(free_port(), free_port(), free_port(), free_port())
    service = JaegerService(binary, tmp_path_factory.mktemp("jaeger"), ports)
    service.up()
    try:
        yield service
    finally:
        service.down()


def _hex(number: int, digits: int) -> str:
    return f"{number:0{digits}x}"


def _parent(span: dict[str, Any]) -> str | None:
    return next(
        (ref["spanID"] for ref in span.get("references", []) if ref["refType"] == "CHILD_OF"),
        None,
    )


def test_one_event_s_trace_is_in_jaeger(relay_bench: RelayBench, jaeger: JaegerService) -> None:
    aggregate_type = f"jt{uuid.uuid4().hex[:10]}"
    topic = topic_for(aggregate_type)
    exporter = OTLPSpanExporter(endpoint=f"{jaeger.otlp_endpoint}/v1/traces", timeout=5)
    with traced(exporter) as spans:
        with trace.get_tracer("order-service").start_as_current_span("place order") as placing:
            with relay_bench.database.connect() as connection, connection.transaction():
                Outbox().publish(connection, Event(aggregate_type, "o-1", "OrderPlaced", {}))
        with relay_bench.in_thread():
            wait_until(lambda: relay_bench.undelivered() == 0, timeout=60, what="relayed")
        engine = sa.create_engine(relay_bench.database.url)
        consumer = IdempotentConsumer(
            name="jaeger-test",
            group_id=f"jaeger-{uuid.uuid4().hex[:8]}",
            topics=[topic],
            bootstrap_servers=relay_bench.kafka.bootstrap_servers,
            begin=sa.orm.sessionmaker(engine).begin,
            handler=lambda _session, _event: None,
            consumer_options=FAST_GROUP,
        )
        try:
            drain(consumer, lambda: consumer.stats.applied >= 1)
        finally:
            consumer.close()
            engine.dispose()
        finished = spans.get_finished_spans()
    (produced,) = [s for s in finished if s.kind is SpanKind.PRODUCER and s.name != "send"]
    sent = [s for s in finished if s.name == "send" and s.links]
    assert len(sent) == 1

    trace_id = _hex(placing.get_span_context().trace_id, 32)
    names = {"place order", f"create {topic}", f"process {topic}"}
    wait_until(
        lambda: names <= {span["operationName"] for span in jaeger.trace(trace_id)},
        timeout=60,
        what=f"Jaeger holding the spans {sorted(names)} of trace {trace_id}",
    )
    by_name = {span["operationName"]: span for span in jaeger.trace(trace_id)}
    assert _parent(by_name[f"create {topic}"]) == by_name["place order"]["spanID"]
    assert _parent(by_name[f"process {topic}"]) == by_name[f"create {topic}"]["spanID"]
    assert by_name[f"create {topic}"]["spanID"] == _hex(produced.context.span_id, 16)

    relay_trace = _hex(sent[0].context.trace_id, 32)
    wait_until(
        lambda: any(span["operationName"] == "send" for span in jaeger.trace(relay_trace)),
        timeout=60,
        what=f"Jaeger holding the relay's batch span (trace {relay_trace})",
    )
    (batch,) = [s for s in jaeger.trace(relay_trace) if s["operationName"] == "send"]
    referred = {ref["spanID"] for ref in batch.get("references", [])}
    assert _hex(produced.context.span_id, 16) in referred, batch.get("references")


def test_the_stack_s_jaeger_listens_on_loopback_only(jaeger: JaegerService) -> None:
    import psutil

    pid = jaeger.process.pid()
    assert pid is not None
    listening = [
        c.laddr for c in psutil.Process(pid).net_connections(kind="inet") if c.status == "LISTEN"
    ]
    assert listening
    assert all(address.ip in {"127.0.0.1", "::1"} for address in listening), listening


def test_a_missing_go_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from outbox_stack.errors import StackError

    monkeypatch.setenv("PATH", str(tmp_path))  # no `go` there
    with pytest.raises(StackError, match="install Go"):
        jaeger_binary(tmp_path / "downloads")
