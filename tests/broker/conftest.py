"""The broker under test of the conformance suite: the one named by
``OUTBOX_KAFKA_BOOTSTRAP_SERVERS``, else the local stack's Apache Kafka, started here.

Defined here rather than in a ``tests/fix_*.py`` plugin: the suite lives apart from
tests/integration so that ``make test-broker`` runs it alone against any cluster; its module
is marked ``integration``, so ``make test-unit`` leaves it out.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from outbox_stack.broker import KafkaBroker
from tests.fix_postgres import free_port
from tests.fix_stack import stack_settings


def conformance_targets() -> list[str]:
    """The brokers the conformance suite checks: the one named by
    ``OUTBOX_KAFKA_BOOTSTRAP_SERVERS``, else the local stack's broker."""
    external = os.environ.get("OUTBOX_KAFKA_BOOTSTRAP_SERVERS")
    return [f"external:{external}"] if external else ["local"]


@dataclass(frozen=True)
class BrokerUnderTest:
    bootstrap_servers: str
    name: str


@pytest.fixture(scope="session", params=conformance_targets())
def broker_under_test(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[BrokerUnderTest]:
    """A broker under test (a local one is started, and stopped at the end)."""
    kind, _, target = str(request.param).partition(":")
    if kind == "external":
        yield BrokerUnderTest(target, f"the broker at {target}")
        return
    root = tmp_path_factory.mktemp("broker")
    broker = KafkaBroker(stack_settings(root, free_port()))
    broker.up()
    try:
        yield BrokerUnderTest(broker.bootstrap_servers, broker.describe())
    finally:
        broker.down()
