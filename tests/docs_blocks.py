"""The code blocks of the README and docs/, and what each one claims to be.

Every fenced block of a page is one of:

- a Python program (```` ```python ````): run as a program against a real PostgreSQL
  (``OUTBOX_DATABASE_URL``), with the base install only unless marked
  ``<!-- needs: relay -->`` (or ``lake``, ``stack``): the libraries of the other extras
  cannot be imported while it runs;
- commands of ours (```` ``` ```` without a language, or ``sh``/``shell``/``console``): each
  line an ``outbox ...`` command, run through the real CLI against a migrated database of
  its own (``<!-- roles: a b -->`` creates those roles for it; ``needs:`` as above);
- an excerpt, marked by the comment on the line before the block:
  ``<!-- excerpt of PATH, run by TEST -->`` for Python (each line of the excerpt is a line
  of the full program PATH, in order, and TEST runs PATH), or
  ``<!-- excerpt: REASON -->`` for commands that cannot run here (they need the local stack,
  Kafka, Docker, or stand for values of yours);
- text that is not code: ``text``, ``json``, ``yaml``, ``sql``, ``ini``.

``tests/unit/test_doc_blocks.py`` checks the marks and the excerpts against their programs;
``tests/integration/test_docs.py`` runs the programs and the commands.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Pages whose blocks others test: analysts.md's SQL runs against a lake the real job filled
# (the lake's tests), not here.
TESTED_ELSEWHERE = {"docs/analysts.md"}
NOT_CODE = {"text", "json", "yaml", "sql", "ini", "toml"}
SHELL = {"", "sh", "shell", "console", "bash"}
EXTRAS = ("relay", "lake", "stack")  # each includes the ones before it

_FENCE = re.compile(r"^(?P<indent>[ \t]*)```(?P<info>[^\s`]*)[ \t]*$")
_MARK = re.compile(r"^\s*<!--\s*(?P<mark>.*?)\s*-->\s*$")
_EXCERPT_OF = re.compile(r"excerpt of (?P<program>\S+), run by (?P<test>\S+)")


def pages() -> list[str]:
    """The README and every page of docs/, but those tested elsewhere."""
    docs = sorted(str(path.relative_to(ROOT)) for path in (ROOT / "docs").glob("*.md"))
    found = ["README.md", *docs]
    return [page for page in found if page not in TESTED_ELSEWHERE]


@dataclass(frozen=True)
class Block:
    page: str
    line: int
    """1-based line of the opening fence."""
    info: str
    code: str
    marks: tuple[str, ...]

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"

    @property
    def excerpt_of(self) -> tuple[str, str] | None:
        """(full program, the test that runs it) of a Python excerpt."""
        for mark in self.marks:
            found = _EXCERPT_OF.fullmatch(mark)
            if found:
                return found["program"], found["test"]
        return None

    @property
    def excerpt_reason(self) -> str | None:
        for mark in self.marks:
            if mark.startswith("excerpt:"):
                return mark.removeprefix("excerpt:").strip()
        return None

    @property
    def is_excerpt(self) -> bool:
        return self.excerpt_of is not None or self.excerpt_reason is not None

    @property
    def needs(self) -> str | None:
        """The largest extra the block needs (None: the base install)."""
        for mark in self.marks:
            if mark.startswith("needs:"):
                return mark.removeprefix("needs:").strip()
        return None

    @property
    def roles(self) -> list[str]:
        for mark in self.marks:
            if mark.startswith("roles:"):
                return mark.removeprefix("roles:").split()
        return []

    @property
    def kind(self) -> str:
        """python, shell or text."""
        if self.info == "python":
            return "python"
        if self.info in SHELL:
            return "shell"
        if self.info in NOT_CODE:
            return "text"
        return f"unknown ({self.info})"

    def commands(self) -> list[list[str]]:
        """The block's commands as argument lists (comments and blank lines dropped;
        ``a && b`` and ``\\`` continuations understood)."""
        joined = re.sub(r"\\\n", " ", self.code)
        found = []
        for line in joined.splitlines():
            words = shlex.split(line, comments=True)
            command: list[str] = []
            for word in [*words, "&&"]:
                if word == "&&":
                    if command:
                        found.append(command)
                    command = []
                else:
                    command.append(word)
        return found


def blocks(page: str) -> list[Block]:
    """The fenced blocks of ``page`` with the marks on the lines just above each."""
    lines = (ROOT / page).read_text().splitlines()
    found = []
    number = 0
    while number < len(lines):
        opening = _FENCE.match(lines[number])
        if opening is None:
            number += 1
            continue
        indent = opening["indent"]
        body: list[str] = []
        end = number + 1
        while end < len(lines) and lines[end].strip() != "```":
            body.append(lines[end][len(indent) :] if lines[end].startswith(indent) else lines[end])
            end += 1
        marks = []
        above = number - 1
        while above >= 0 and (mark := _MARK.match(lines[above])) is not None:
            marks.insert(0, mark["mark"])
            above -= 1
        found.append(Block(page, number + 1, opening["info"], "\n".join(body) + "\n", tuple(marks)))
        number = end + 1
    return found


def all_blocks() -> list[Block]:
    return [block for page in pages() for block in blocks(page)]


def program_lines(text: str) -> list[str]:
    """The lines that say something, for comparing an excerpt with its program: stripped, no
    inline comments, no blank or comment-only lines (``...`` kept: it separates pieces)."""
    kept = []
    for line in text.splitlines():
        line = re.split(r"\s{2,}#\s", line, maxsplit=1)[0].strip()
        if line and not line.startswith("#"):
            kept.append(line)
    return kept


def missing_from(excerpt: str, program: str) -> list[str]:
    """The excerpt's lines that are not in ``program`` ([] if all are). Each piece of the
    excerpt (pieces are separated by ``...`` lines) is a run of the program's lines in
    order, gaps allowed; the pieces may come from anywhere in it."""
    have = [line for line in program_lines(program) if line != "..."]
    piece: list[str] = []
    pieces = [piece]
    for line in program_lines(excerpt):
        if line == "...":
            piece = []
            pieces.append(piece)
        else:
            piece.append(line)
    for wanted in pieces:
        position = 0
        for index, line in enumerate(wanted):
            try:
                position = have.index(line, position) + 1
            except ValueError:
                return wanted[index:]
    return []


def blocked_libraries(needs: str | None) -> list[str]:
    """The libraries a block may not import: those of the extras it does not need."""
    from outbox_cli._common import EXTRA_OF_LIBRARY

    allowed = set(EXTRAS[: EXTRAS.index(needs) + 1]) if needs else set()
    return sorted(name for name, extra in EXTRA_OF_LIBRARY.items() if extra not in allowed)


def import_blocker(needs: str | None) -> str:
    """A ``sitecustomize`` module that makes the libraries of the extras a block does not need
    impossible to import, as in an environment where they are not installed."""
    return (
        "import sys\n"
        "class _NotInstalled:\n"
        f"    blocked = {set(blocked_libraries(needs))!r}\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in self.blocked:\n"
        "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
        "        return None\n"
        "sys.meta_path.insert(0, _NotInstalled())\n"
    )
