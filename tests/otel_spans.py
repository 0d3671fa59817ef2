"""One OpenTelemetry SDK for the whole test process (the global tracer provider can be set
only once), its spans kept in memory for the tests to read."""

from __future__ import annotations

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

EXPORTER = InMemorySpanExporter()
_PROVIDER = TracerProvider()
_PROVIDER.add_span_processor(SimpleSpanProcessor(EXPORTER))


def installed() -> InMemorySpanExporter:
    """The SDK as this process's tracer provider (once), its exporter emptied."""
    if trace.get_tracer_provider() is not _PROVIDER:
        trace.set_tracer_provider(_PROVIDER)
    EXPORTER.clear()
    return EXPORTER
