"""The broker under test of the conformance suite: the one named by
``OUTBOX_KAFKA_BOOTSTRAP_SERVERS``, else each engine of the local broker, started here.

Defined here rather than in a ``tests/fix_*.py`` plugin: the suite lives apart from
tests/integration so that ``make test-broker`` runs it alone against any cluster; its module
is marked ``integration``, so ``make test-unit`` leaves it out.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from outbox_stack.broker import TansuBroker
from tests.fix_postgres import free_port
from tests.fix_stack import Storage, stack_settings


def conformance_targets() -> list[str]:
    """The brokers the conformance suite checks: the one named by
    ``OUTBOX_KAFKA_BOOTSTRAP_SERVERS``, else both engines of the local broker."""
    external = os.environ.get("OUTBOX_KAFKA_BOOTSTRAP_SERVERS")
    return [f"external:{external}"] if external else ["local:memory", "local:s3"]


@dataclass(frozen=True)
class BrokerUnderTest:
    bootstrap_servers: str
    name: str
    exact_end_offsets: bool
    """Whether ListOffsets must count every acknowledged record: yes for any broker but the
    local one, whose undercount is known on both engines (the project does not trust it)."""


@pytest.fixture(scope="session", params=conformance_targets())
def broker_under_test(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[BrokerUnderTest]:
    """A broker under test (a local one is started, and stopped at the end)."""
    kind, _, target = str(request.param).partition(":")
    if kind == "external":
        yield BrokerUnderTest(target, f"the broker at {target}", exact_end_offsets=True)
        return
    storage: Storage = "s3" if target == "s3" else "memory"
    root = tmp_path_factory.mktemp(f"broker-{storage}")
    broker = TansuBroker(stack_settings(root, free_port(), storage))
    broker.up()
    try:
        yield BrokerUnderTest(broker.bootstrap_servers, broker.describe(), exact_end_offsets=False)
    finally:
        broker.down()
