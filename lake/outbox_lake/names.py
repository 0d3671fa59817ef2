"""The name of an aggregate type's typed table (``aggregate_<type>``)."""

from __future__ import annotations

import hashlib
import re

from outbox_lake.tables import TYPED_PREFIX

__all__ = ["typed_table_name"]


def typed_table_name(aggregate_type: str) -> str:
    """``aggregate_<type>``: one table per aggregate type, never shared.

    A type of lowercase letters, digits and single underscores keeps its name
    (``order`` → ``aggregate_order``). Any other type is reduced to those characters and
    given 8 hex digits of its SHA-256 after ``__``, a suffix no kept name can end with
    (``Order`` → ``aggregate_order__<hash>``, ``order.v2`` and ``order-v2`` apart). Each
    table also records its aggregate type (Delta metadata name): a collision is refused.
    """
    if re.fullmatch(r"[a-z0-9_]+", aggregate_type) and "__" not in aggregate_type:
        return TYPED_PREFIX + aggregate_type
    reduced = re.sub(r"[^a-z0-9]+", "_", aggregate_type.lower()).strip("_")[:80] or "x"
    digest = hashlib.sha256(aggregate_type.encode("utf-8", "surrogatepass")).hexdigest()[:8]
    return f"{TYPED_PREFIX}{reduced}__{digest}"
