"""The payment provider's API as the side-effect ledger's ``call`` and ``lookup``: stdlib HTTP.

Needs the base install only (no Kafka): the side-effects page's complete program uses it with
``Effects`` alone; ``outbox_examples.payment_effects`` puts it behind an ``IdempotentConsumer``.
The provider (``outbox_examples.payment_provider``) does not deduplicate: the ledger must.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from datetime import timedelta

from outbox.effects import EffectNotPerformedError, EffectStep, LookupAnswer

__all__ = ["ProviderClient"]


class ProviderClient:
    """The provider's API, as the ledger's ``call`` and ``lookup`` (stdlib HTTP, 5 s timeout).

    ``settle_after`` is the charge effect's settle time: how long after a charge request is
    sent the provider may still make it or not yet show it to ``find``. It is the provider's
    processing time (which our timeout does not cut short) plus the lag of its lookup, with
    margin; not our timeout.
    """

    def __init__(
        self, url: str, timeout: float = 5.0, settle_after: timedelta = timedelta(seconds=30)
    ) -> None:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"--provider {url!r}: give an http:// or https:// URL")
        self.url = url.rstrip("/")  # only http(s): the urlopen calls below are safe (S310)
        self.timeout = timeout
        self.settle_after = settle_after

    def charge(self, step: EffectStep) -> str:
        """POST the charge with the step's idempotency key; the provider's charge id."""
        request = urllib.request.Request(  # noqa: S310
            f"{self.url}/charges",
            # Amounts in the context are exact Decimals: sent as strings ("9.90"), as payment
            # APIs take money, never as binary floats.
            data=json.dumps(step.context, default=str).encode(),
            headers={"Idempotency-Key": str(step.idempotency_key)},
            method="POST",
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as answer:  # noqa: S310
                return str(json.load(answer)["id"])
        except urllib.error.HTTPError as error:
            if 400 <= error.code < 500:  # refused: certainly no charge was made
                raise EffectNotPerformedError(f"the provider refused: {error.code}") from error
            raise  # 5xx: it may or may not have charged; the ledger keeps the step started
        except urllib.error.URLError as error:
            if isinstance(error.reason, ConnectionRefusedError):  # never reached the provider
                raise EffectNotPerformedError("the provider refused the connection") from error
            raise  # a timeout: the request may have arrived, and may yet be charged

    def find(self, step: EffectStep) -> LookupAnswer:
        """Ask the provider whether a charge with the step's key exists."""
        query = f"{self.url}/charges?idempotency_key={step.idempotency_key}"
        try:
            with urllib.request.urlopen(query, timeout=self.timeout) as answer:  # noqa: S310
                return LookupAnswer.happened(str(json.load(answer)["id"]))
        except urllib.error.HTTPError as error:
            if error.code == 404:
                return LookupAnswer.not_happened()
            return LookupAnswer.unknown(f"the provider answered {error.code}")
        except OSError as error:
            return LookupAnswer.unknown(f"the provider is unreachable: {type(error).__name__}")
