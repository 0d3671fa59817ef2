"""The native local stack for development and tests: services on loopback, no Docker.

So far: a private PostgreSQL 15 cluster with logical decoding (:mod:`stack.postgres`).
"""

from stack.errors import StackError
from stack.postgres import PostgresCluster
from stack.settings import StackSettings

__all__ = ["PostgresCluster", "StackError", "StackSettings"]
