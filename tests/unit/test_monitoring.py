"""The shipped alert rules and dashboard (monitoring/): they parse, and every metric they name
is one the project exports (the relay's, the lake job's and reconcile's registries)."""

from __future__ import annotations

import contextlib
import importlib
import inspect
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

from outbox import effect_metrics
from outbox.effect_metrics import EffectsMetrics
from outbox_reconcile.metrics import ReconcileMetrics
from outbox_relay.metrics import RelayMetrics

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "monitoring" / "outbox-alerts.yml"
DASHBOARD = ROOT / "monitoring" / "outbox-dashboard.json"
GUIDE = ROOT / "docs" / "verifying-delivery.md"

_SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "summary": ("_sum", "_count", "_created"),
    "gauge": ("",),
    "info": ("_info",),
}


def exported(registry: CollectorRegistry) -> set[str]:
    """The series names a registry exposes, labelled metrics without children included."""
    names: set[str] = set()
    for family in registry.collect():
        names.update(family.name + suffix for suffix in _SUFFIXES.get(family.type, ("",)))
    return names


def lake_registries() -> list[CollectorRegistry]:
    """The registries lake/outbox_lake/metrics.py defines: module-level ones, and those of its
    ``*Metrics`` classes (built without arguments, as RelayMetrics is)."""
    module = importlib.import_module("outbox_lake.metrics")
    found = [value for value in vars(module).values() if isinstance(value, CollectorRegistry)]
    for name, value in vars(module).items():
        if (
            inspect.isclass(value)
            and name.endswith("Metrics")
            and value.__module__ == module.__name__
        ):
            registry = getattr(value(), "registry", None)
            if isinstance(registry, CollectorRegistry):
                found.append(registry)
    return found


def named_metrics(expression: str) -> set[str]:
    return set(re.findall(r"\b(outbox_[a-z0-9_]+)\b", expression))


def rules() -> list[dict[str, Any]]:
    document = yaml.safe_load(RULES.read_text())
    return [rule for group in document["groups"] for rule in group["rules"]]


def dashboard_expressions() -> list[str]:
    document = json.loads(DASHBOARD.read_text())
    return [target["expr"] for panel in document["panels"] for target in panel["targets"]]


def all_expressions() -> list[str]:
    return [rule["expr"] for rule in rules()] + dashboard_expressions()


def test_the_rules_parse_and_each_is_complete() -> None:
    document = yaml.safe_load(RULES.read_text())
    assert [group["name"] for group in document["groups"]]
    names = [rule["alert"] for rule in rules()]
    assert len(names) == len(set(names)), "alert names must be unique"
    anchors = {
        re.sub(r"[^a-z0-9 -]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
        for line in GUIDE.read_text().splitlines()
        if line.startswith("#")
    }
    for rule in rules():
        assert set(rule) <= {"alert", "expr", "for", "labels", "annotations"}, rule["alert"]
        assert re.fullmatch(r"Outbox[A-Za-z]+", rule["alert"])
        assert rule["labels"]["severity"] in {"warning", "critical"}
        assert rule["annotations"]["summary"]
        assert "for" not in rule or re.fullmatch(r"\d+[smh]", rule["for"])
        page, _, anchor = rule["annotations"]["runbook"].partition("#")
        assert page == "docs/verifying-delivery.md"
        assert anchor in anchors, f"{rule['alert']}: no heading #{anchor} in {GUIDE.name}"


@pytest.mark.parametrize("expression", all_expressions())
def test_every_expression_is_balanced_and_names_a_metric(expression: str) -> None:
    depth = {"(": 0, "[": 0, "{": 0}
    closing = {")": "(", "]": "[", "}": "{"}
    for char in expression:
        if char in depth:
            depth[char] += 1
        elif char in closing:
            depth[closing[char]] -= 1
            assert depth[closing[char]] >= 0, expression
    assert all(value == 0 for value in depth.values()), expression
    assert named_metrics(expression), expression


def test_the_dashboard_parses_with_unique_panels_on_the_grid() -> None:
    document = json.loads(DASHBOARD.read_text())
    ids = [panel["id"] for panel in document["panels"]]
    assert len(ids) == len(set(ids))
    for panel in document["panels"]:
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        assert panel["targets"], panel["title"]


def effects_registry(monkeypatch: pytest.MonkeyPatch) -> CollectorRegistry:
    """The side-effect ledger's registry, its scrape answered with no parked step (its
    gauges query the database when scraped; here the query's answer is empty)."""
    monkeypatch.setattr(effect_metrics, "decision_summary", lambda *_, **__: [])
    return EffectsMetrics(contextlib.nullcontext).registry


def test_every_relay_reconcile_and_effects_metric_named_exists(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    known = (
        exported(RelayMetrics().registry)
        | exported(ReconcileMetrics().registry)
        | exported(effects_registry(monkeypatch))
    )
    named = set().union(*(named_metrics(e) for e in all_expressions()))
    ours = {name for name in named if not name.startswith("outbox_lake_")}
    assert ours - known == set(), f"named but not exported: {sorted(ours - known)}"


def test_every_lake_metric_named_exists_in_lake_metrics() -> None:
    named = set().union(*(named_metrics(e) for e in all_expressions()))
    lake = {name for name in named if name.startswith("outbox_lake_")}
    assert lake, "the rules watch the lake job"
    try:
        registries = lake_registries()
    except ModuleNotFoundError:
        pytest.fail(
            f"outbox_lake.metrics does not exist: the rules and dashboard name {sorted(lake)}; "
            "they must be exported by the lake job's metrics"
        )
    assert registries, "lake/outbox_lake/metrics.py defines no CollectorRegistry nor *Metrics class"
    known = set().union(*(exported(registry) for registry in registries))
    assert lake - known == set(), (
        f"named in monitoring/ but not exported by outbox_lake.metrics: {sorted(lake - known)}; "
        f"it exports {sorted(known)}"
    )
