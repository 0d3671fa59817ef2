"""docs/settings.md is generated from the settings classes and must match them: a field added,
renamed, given another default or meaning, fails here until the page is written again
(``python -m tools.settings_reference --write``). And every ``OUTBOX_*`` variable the docs
name is one the code reads."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tools.settings_reference import COMPONENTS, PAGE, render, variables

ROOT = Path(__file__).resolve().parents[2]


def test_the_page_is_what_the_settings_classes_say() -> None:
    assert PAGE.read_text() == render(), (
        "docs/settings.md is stale: python -m tools.settings_reference --write"
    )


@pytest.mark.parametrize("component", COMPONENTS, ids=lambda c: c.class_name)
def test_every_variable_has_a_meaning(component: object) -> None:
    missing = [v.name for v in variables(component) if not v.meaning]  # type: ignore[arg-type]
    assert not missing, (
        f"give these fields a docstring in their settings class (use_attribute_docstrings): "
        f"{missing}"
    )


def documented_names() -> dict[str, set[str]]:
    """Each OUTBOX_* variable the README and docs/ name, with the pages naming it."""
    found: dict[str, set[str]] = {}
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for name in re.findall(r"\bOUTBOX_[A-Z0-9_]*[A-Z0-9]\b", page.read_text()):
            found.setdefault(name, set()).add(str(page.relative_to(ROOT)))
    return found


def test_every_variable_the_docs_name_exists() -> None:
    known = {v.name for component in COMPONENTS for v in variables(component)}
    unknown = {name: pages for name, pages in documented_names().items() if name not in known}
    assert not unknown, f"named in the docs, read by no settings class: {unknown}"
