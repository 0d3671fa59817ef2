"""``outbox reconcile`` and ``outbox trace``: check, after the fact, what the pipeline promises.

A small pure core (:mod:`outbox_reconcile.records`, :mod:`outbox_reconcile.evidence`,
:mod:`outbox_reconcile.findings`: standard library only) and thin adapters that read the outbox
(:mod:`outbox_reconcile.outbox_reader`, psycopg), Kafka (:mod:`outbox_reconcile.kafka_reader`,
kafka-python with manual assignment) and the lake (:mod:`outbox_reconcile.lake_reader`,
``deltalake``). Everything is read-only. Memory is bounded: what is read is streamed into an
on-disk SQLite file (:class:`outbox_reconcile.evidence.Evidence`) and compared there; only counts
and a few examples per finding are kept in memory.
"""
