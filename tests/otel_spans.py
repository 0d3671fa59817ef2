"""One OpenTelemetry SDK for the whole test process, on only while a test asks for it.

The global tracer provider can be set only once per process, and tests that share a worker
process with a tracing test must see no SDK (no traceparent invented for their events). So
the process's provider hands out tracers that delegate to the SDK while :func:`traced` is on,
and to OpenTelemetry's no-op tracer otherwise; the spans are kept in memory."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

EXPORTER = InMemorySpanExporter()
_SDK = TracerProvider()
_SDK.add_span_processor(SimpleSpanProcessor(EXPORTER))
_ON = [False]


class _SwitchedTracer(trace.Tracer):
    def __init__(self, sdk: trace.Tracer) -> None:
        self._sdk = sdk
        self._off = trace.NoOpTracer()

    def _now(self) -> trace.Tracer:
        return self._sdk if _ON[0] else self._off

    def start_span(self, *args: Any, **kwargs: Any) -> trace.Span:
        return self._now().start_span(*args, **kwargs)

    @contextlib.contextmanager
    def start_as_current_span(self, *args: Any, **kwargs: Any) -> Iterator[trace.Span]:
        with self._now().start_as_current_span(*args, **kwargs) as span:
            yield span


class _SwitchedProvider(trace.TracerProvider):
    def get_tracer(self, *args: Any, **kwargs: Any) -> trace.Tracer:
        return _SwitchedTracer(_SDK.get_tracer(*args, **kwargs))


_PROVIDER = _SwitchedProvider()


@contextlib.contextmanager
def traced() -> Iterator[InMemorySpanExporter]:
    """The SDK on for the block (this process's tracer provider from the first call), its
    spans in the exporter yielded; off again, and the spans dropped, after it."""
    if trace.get_tracer_provider() is not _PROVIDER:
        trace.set_tracer_provider(_PROVIDER)
    EXPORTER.clear()
    _ON[0] = True
    try:
        yield EXPORTER
    finally:
        _ON[0] = False
        EXPORTER.clear()
