"""The shipped alert rules and dashboard (monitoring/): they parse, every metric they name is
one the project exports (the relay's, the lake job's and reconcile's registries), and the
dashboard shows every metric an alert watches."""

from __future__ import annotations

import contextlib
import importlib
import inspect
import json
import re
import socket
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
# Pages an alert's runbook may point to (an anchor of one of their headings).
RUNBOOK_PAGES = ("docs/verifying-delivery.md", "docs/operations.md")

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
        page: {
            re.sub(r"[^a-z0-9 -]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
            for line in (ROOT / page).read_text().splitlines()
            if line.startswith("#")
        }
        for page in RUNBOOK_PAGES
    }
    for rule in rules():
        assert set(rule) <= {"alert", "expr", "for", "labels", "annotations"}, rule["alert"]
        assert re.fullmatch(r"Outbox[A-Za-z]+", rule["alert"])
        assert rule["labels"]["severity"] in {"warning", "critical"}
        assert rule["annotations"]["summary"]
        assert "for" not in rule or re.fullmatch(r"\d+[smhd]", rule["for"])
        page, _, anchor = rule["annotations"]["runbook"].partition("#")
        assert page in RUNBOOK_PAGES, rule["alert"]
        assert anchor in anchors[page], f"{rule['alert']}: no heading #{anchor} in {page}"


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


def test_the_dashboard_shows_every_metric_an_alert_watches() -> None:
    """An alert that fires sends someone to the dashboard: what it watches must be there."""
    alerted = set().union(*(named_metrics(rule["expr"]) for rule in rules()))
    shown = set().union(*(named_metrics(e) for e in dashboard_expressions()))
    assert alerted - shown == set(), f"no dashboard panel shows: {sorted(alerted - shown)}"


def test_the_relay_watches_the_slots_live_and_alerts_use_it() -> None:
    """Retained WAL fills the disk within hours: it is alerted from the relay's live metric,
    not only from the nightly reconcile."""
    by_name = {rule["alert"]: rule["expr"] for rule in rules()}
    assert "outbox_relay_slot_retained_wal_bytes" in by_name["OutboxSlotRetainsWal"]
    assert any("outbox_relay_slot_wal_status" in expr for expr in by_name.values())


def test_unreadable_slots_are_reported_without_failing_the_scrape() -> None:
    """PostgreSQL unreachable: the scrape answers, ``outbox_relay_slot_read_ok`` is 0."""
    from prometheus_client import generate_latest

    from outbox_relay.metrics import SlotWatch

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed = int(probe.getsockname()[1])
    watch = SlotWatch(f"host=127.0.0.1 port={closed} dbname=x user=x connect_timeout=2")
    watch.refresh()
    text = generate_latest(RelayMetrics(slots=watch.latest).registry).decode()
    watch.close()
    assert "outbox_relay_slot_read_ok 0.0" in text
    assert "outbox_relay_slot_retained_wal_bytes{" not in text
