"""One OpenTelemetry SDK at a time for the test process, on only while a test asks for it.

The global tracer provider can be set only once per process, and tests that share a worker
process with a tracing test must see no SDK (no traceparent invented for their events). So
the process's provider hands out tracers that delegate to the SDK of the :func:`traced` block
under way, and to OpenTelemetry's no-op tracer otherwise. Each block's SDK keeps its spans
in memory, and may also export them (to a real tracing backend)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

_CURRENT: list[TracerProvider | None] = [None]


class _SwitchedTracer(trace.Tracer):
    def __init__(self, name: str) -> None:
        self._name = name
        self._off = trace.NoOpTracer()

    def _now(self) -> trace.Tracer:
        provider = _CURRENT[0]
        return self._off if provider is None else provider.get_tracer(self._name)

    def start_span(self, *args: Any, **kwargs: Any) -> trace.Span:
        return self._now().start_span(*args, **kwargs)

    @contextlib.contextmanager
    def start_as_current_span(self, *args: Any, **kwargs: Any) -> Iterator[trace.Span]:
        with self._now().start_as_current_span(*args, **kwargs) as span:
            yield span


class _SwitchedProvider(trace.TracerProvider):
    def get_tracer(self, name: str, *args: Any, **kwargs: Any) -> trace.Tracer:
        return _SwitchedTracer(name)


_PROVIDER = _SwitchedProvider()


@contextlib.contextmanager
def traced(*exporters: SpanExporter) -> Iterator[InMemorySpanExporter]:
    """An SDK on for the block (this process's tracer provider from the first call), its
    spans in the in-memory exporter yielded and sent to ``exporters`` as each ends; flushed
    and off again after the block."""
    if trace.get_tracer_provider() is not _PROVIDER:
        trace.set_tracer_provider(_PROVIDER)
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    for exporter in (memory, *exporters):
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    _CURRENT[0] = provider
    try:
        yield memory
    finally:
        _CURRENT[0] = None
        provider.shutdown()
