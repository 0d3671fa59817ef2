"""Every ``python`` code block of the user docs runs, as a program, against a real database."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fix_postgres import ScratchDatabase

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = ["docs/application-developers.md", "docs/side-effects.md"]
_BLOCK = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)


def blocks() -> list[tuple[str, str]]:
    found = []
    for document in DOCUMENTS:
        text = (ROOT / document).read_text()
        for number, match in enumerate(_BLOCK.finditer(text), start=1):
            found.append((f"{document}#{number}", match.group(1)))
    return found


def test_the_docs_have_examples() -> None:
    assert len(blocks()) >= 4


@pytest.mark.parametrize(("where", "code"), blocks(), ids=[where for where, _ in blocks()])
def test_doc_example_runs(where: str, code: str, database: ScratchDatabase) -> None:
    result = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "OUTBOX_DATABASE_URL": database.url},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert result.returncode == 0, f"{where} failed:\n{result.stderr[-3000:]}"
