"""The lake: a PySpark Structured Streaming job that lands outbox events exactly once in Delta
tables (``events``, one typed table per aggregate type, ``quarantine``), and the analysts'
queries over them. See docs/analysts.md and docs/operations.md."""
