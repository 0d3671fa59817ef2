"""Prometheus metrics of the side-effect ledger, read from the database at each scrape.

- ``outbox_effects_needing_decision{consumer}``: steps parked for an operator;
- ``outbox_effects_oldest_decision_age_seconds{consumer}``: how long the oldest has waited;
- ``outbox_effects_scrape_ok``: 1 when the ledger could be read, 0 when not (the two above
  are then absent rather than stale).

The ledger lives in the consumer's own database, so the consumer service serves these (for
example ``prometheus_client.start_http_server(9100, registry=metrics.registry)``). Alert on
any step needing a decision: each is a call nobody knows the fate of. Labels carry consumer
names only: no context, no reference, no URL. Needs ``prometheus-client`` (the ``relay``
extra, as the Kafka consumer does).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from outbox.effect_decisions import decision_summary
from outbox.settings import OutboxSettings

__all__ = ["EffectsMetrics"]

log = logging.getLogger("outbox.effects")


class EffectsMetrics:
    """A registry of its own whose gauges query the ledger through ``begin()`` when scraped."""

    def __init__(
        self,
        begin: Callable[[], AbstractContextManager[Any]],
        settings: OutboxSettings | None = None,
    ) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(_DecisionCollector(begin, settings or OutboxSettings()))


class _DecisionCollector(Collector):
    def __init__(
        self, begin: Callable[[], AbstractContextManager[Any]], settings: OutboxSettings
    ) -> None:
        self._begin = begin
        self._settings = settings

    def describe(self) -> list[Metric]:
        return []  # collected on demand only: registering must not query the database

    def collect(self) -> Iterator[Metric]:
        ok = GaugeMetricFamily(
            "outbox_effects_scrape_ok", "1 when the side-effect ledger could be read."
        )
        try:
            with self._begin() as transaction:
                summaries = decision_summary(transaction, settings=self._settings)
        except Exception as error:
            log.warning("cannot read the side-effect ledger: %s", type(error).__name__)
            ok.add_metric([], 0)
            yield ok
            return
        ok.add_metric([], 1)
        yield ok
        count = GaugeMetricFamily(
            "outbox_effects_needing_decision",
            "Steps parked for an operator's decision (outbox effects list).",
            labels=["consumer"],
        )
        age = GaugeMetricFamily(
            "outbox_effects_oldest_decision_age_seconds",
            "How long the oldest step needing a decision has waited.",
            labels=["consumer"],
        )
        for summary in summaries:
            count.add_metric([summary.consumer], summary.steps)
            age.add_metric([summary.consumer], summary.oldest_age_seconds)
        yield count
        yield age
