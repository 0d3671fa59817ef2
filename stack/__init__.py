"""The native local stack for development and tests: services on loopback, no Docker.

A private PostgreSQL 15 with logical decoding (:mod:`stack.postgres`), a Kafka-protocol broker
(:mod:`stack.broker`), and a Kafka Connect worker with Debezium (:mod:`stack.connect`),
started together by :class:`stack.local.LocalStack`.
"""

from stack.errors import StackError
from stack.postgres import PostgresCluster
from stack.settings import StackSettings

__all__ = ["PostgresCluster", "StackError", "StackSettings"]
