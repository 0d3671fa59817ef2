"""Asking a running relay how it is, over its HTTP endpoint (:mod:`outbox_relay.health`):
its probes' answers and its metrics' samples, each within a timeout.

``outbox relay health`` (a container's health check) and the console (``outbox console``)
both ask through here.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from dataclasses import dataclass

__all__ = ["ProbeAnswer", "Sample", "probe", "scrape"]


@dataclass(frozen=True)
class ProbeAnswer:
    """What ``path`` answered: ``ok`` on 200; ``body`` what the relay said (``ok: leader:
    publishing (polling mode)``), or why there was no answer (``answered`` False)."""

    url: str
    ok: bool
    body: str
    answered: bool = True


@dataclass(frozen=True)
class Sample:
    """One sample of ``/metrics``: its name (with ``_total`` for counters), labels, value."""

    name: str
    labels: dict[str, str]
    value: float


def probe(base_url: str, path: str = "/readyz", *, timeout_seconds: float = 3) -> ProbeAnswer:
    """Ask ``path`` (``/healthz`` or ``/readyz``) of the relay at ``base_url``."""
    url = f"{base_url.rstrip('/')}{path}"
    try:
        with urllib.request.urlopen(url, timeout=timeout_seconds) as answer:  # noqa: S310
            return ProbeAnswer(url, answer.status == 200, answer.read().decode(errors="replace"))
    except urllib.error.HTTPError as error:
        return ProbeAnswer(url, False, error.read().decode(errors="replace"))
    except (urllib.error.URLError, OSError) as error:
        reason = getattr(error, "reason", error)
        return ProbeAnswer(url, False, f"no answer at {url} ({reason})", answered=False)


def scrape(base_url: str, *, timeout_seconds: float = 3) -> list[Sample]:
    """Every sample of the relay's ``/metrics`` (or any Prometheus endpoint at
    ``base_url``); :class:`OSError` when it does not answer, or not with 200."""
    from prometheus_client.parser import text_string_to_metric_families

    url = f"{base_url.rstrip('/')}/metrics"
    with urllib.request.urlopen(url, timeout=timeout_seconds) as answer:  # noqa: S310
        text = answer.read().decode(errors="replace")
    return [
        Sample(sample.name, dict(sample.labels), float(sample.value))
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    ]
