"""Why the ingest job stopped, in one line: from a Spark exception's text (``outbox lake
ingest``) or from the job's log (the demo, which runs the job as a process of its own).

Spark hands the job's errors back as Java exceptions whose text holds the Python one
(``DataLossError: ...``); its Kafka source refuses with words of its own when a checkpoint's
offsets are gone from the broker (a topic the job's start-up check could not compare yet:
it did not exist when the job started).
"""

from __future__ import annotations

import re

__all__ = ["SPARK_DATA_LOSS", "TOPIC_REPLACED", "stop_reason"]

TOPIC_REPLACED = "the topic on the broker is not the one the lake has read"
"""The start of the job's refusal for a topic that is another log than the lake's
(:func:`outbox_lake.offsets.losses`)."""
SPARK_DATA_LOSS = "Some data may have been lost"
"""Spark's Kafka source's words when a checkpoint's offsets are gone from the broker."""

_SPARK_OFFSET_CHANGED = "offset was changed"
_OURS = re.compile(r"\b(DataLossError|DeliveryTimeoutError|TimeoutError|ConfigurationError): (.+)")
_DATA_LOSS_ADVICE = (
    "To go on without those records, restart once with OUTBOX_LAKE_FAIL_ON_DATA_LOSS=false; "
    "see docs/operations.md, 'Data loss'"
)


def stop_reason(text: str) -> str | None:
    """The last error of ours in ``text`` (``DataLossError: ...``), or Spark's own data-loss
    refusal said as one; ``None`` when ``text`` holds neither."""
    ours = _OURS.findall(text)
    if ours:
        name, message = ours[-1]
        return f"{name}: {message.strip()}"
    for words in (SPARK_DATA_LOSS, _SPARK_OFFSET_CHANGED):
        said = next((line.strip() for line in text.splitlines() if words in line), None)
        if said is not None:
            return (
                f"DataLossError: {SPARK_DATA_LOSS} (Spark's Kafka source said: {said[:400]}): "
                "the topic was deleted and recreated, or its records deleted, and the lake's "
                f"checkpoint has read past its end. {_DATA_LOSS_ADVICE}"
            )
    return None
