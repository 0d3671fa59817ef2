"""``pytest -m "not integration"`` selects exactly the tests that need no service.

The marker is applied by tests/conftest.py to everything under tests/integration; this runs
the collection as ``make test-unit`` does and checks what it selects.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def collected(*args: str) -> tuple[list[str], str]:
    """Node ids collected with ``args``, and pytest's summary line."""
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    lines = result.stdout.splitlines()
    return [line for line in lines if "::" in line], lines[-1]


def test_not_integration_selects_exactly_the_unit_tests() -> None:
    selected, summary = collected("-m", "not integration")
    unit, _ = collected("tests/unit")
    assert unit and sorted(selected) == sorted(unit)
    # Everything else (tests/integration, whose modules carry no marker line) was deselected.
    deselected = re.search(r"\((\d+) deselected\)", summary)
    assert deselected is not None and int(deselected.group(1)) > 100, summary
