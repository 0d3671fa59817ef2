"""The chaos suite: the whole pipeline under load while faults are injected, checked against
its own ground truth. Run from the checkout (``make chaos``, ``make chaos ARGS=--short``);
not part of the wheel, nor of ``make test``.

What a run does (docs/verifying-delivery.md, "The chaos suite"):

1. starts a native stack of its own (:mod:`chaos.services`): PostgreSQL, the broker (Apache
   Kafka), Kafka Connect with the connector, two relays in auto mode (one on standby) each
   behind a TCP proxy, the lake job (continuous);
2. runs eight writers (:mod:`chaos.writers`): psycopg and SQLAlchemy, sync and async, on
   their own orders and on shared accounts whose events are built before the rows are
   locked; some roll back on purpose, some commits race with a kill of their backend;
   every event's fate goes into the ground truth (:mod:`chaos.truth`);
3. meanwhile injects faults on a schedule drawn from the seed (:mod:`chaos.schedule`,
   :mod:`chaos.faults`), each kind as often as asked, some at the same time, and brings
   back what they broke as an operator would;
4. drains, then checks the lake and Kafka against the ground truth (:mod:`chaos.verify`) and
   runs ``outbox reconcile --json``; prints the tables (:mod:`chaos.report`) and exits 1 on
   any violation.
"""
