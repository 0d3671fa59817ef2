"""``outbox reconcile`` and ``outbox trace``: check, after the fact, what the pipeline promises.

A small pure core (:mod:`reconcile.records`, :mod:`reconcile.evidence`,
:mod:`reconcile.findings`: standard library only) and thin adapters that read the outbox
(:mod:`reconcile.outbox_reader`, psycopg), Kafka (:mod:`reconcile.kafka_reader`,
kafka-python with manual assignment) and the lake (:mod:`reconcile.lake_reader`,
``deltalake``). Everything is read-only. Memory is bounded: what is read is streamed into an
on-disk SQLite file (:class:`reconcile.evidence.Evidence`) and compared there; only counts and
a few examples per finding are kept in memory.
"""
