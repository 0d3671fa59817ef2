"""The native local stack for development and tests: services on loopback, no Docker.

A private PostgreSQL 15 with logical decoding (:mod:`outbox_stack.postgres`), a Kafka-protocol
broker (:mod:`outbox_stack.broker`), and a Kafka Connect worker with Debezium
(:mod:`outbox_stack.connect`), started together by :class:`outbox_stack.local.LocalStack`.
"""

from outbox_stack.errors import StackError
from outbox_stack.postgres import PostgresCluster
from outbox_stack.settings import StackSettings

__all__ = ["PostgresCluster", "StackError", "StackSettings"]
