"""The relay process's garbage collector thresholds (relay/outbox_relay/collector.py)."""

from __future__ import annotations

import gc

from outbox_relay.collector import YOUNG_GENERATION_OBJECTS, collect_young_rarely


def test_the_young_generation_is_collected_rarely_and_the_older_ones_as_before() -> None:
    before = gc.get_threshold()
    try:
        gc.set_threshold(700, 10, 10)  # CPython's defaults
        collect_young_rarely()
        assert gc.get_threshold() == (YOUNG_GENERATION_OBJECTS, 10, 10)
    finally:
        gc.set_threshold(*before)


def test_a_young_generation_collected_more_rarely_already_stays_so() -> None:
    before = gc.get_threshold()
    try:
        gc.set_threshold(YOUNG_GENERATION_OBJECTS * 5, 7, 3)
        collect_young_rarely()
        assert gc.get_threshold() == (YOUNG_GENERATION_OBJECTS * 5, 7, 3)
    finally:
        gc.set_threshold(*before)
