"""How the commands that list things print them: a table for people, JSON for scripts.

A listing command prints its rows as one rich table on stdout, nothing at all when there are
none, then its one summary line (``3 dead letter(s)``) on stderr. With ``--json`` it prints one JSON
document on stdout instead of the table (times in ISO 8601, decimals and ids as strings;
the summary line still goes to stderr): scripts read that, never the table, whose layout
follows the terminal's width. Cells are shown as given: text that looks like rich markup
(``[red]``) is printed as it is, never interpreted, and what a terminal would act on or hide
(an escape sequence, a zero-width space) is escaped (``\\x1b``, ``\\u200b``).
"""

from __future__ import annotations

import io
import json
import shutil
import sys
from collections.abc import Iterable, Sequence
from datetime import date, datetime
from decimal import Decimal
from pathlib import PurePath
from typing import Any
from uuid import UUID

import typer

JSON_OPTION = typer.Option(False, "--json", help="Print JSON (for scripts) instead of a table.")
WIDE = 200
"""The width of a table that goes to a file or a pipe: one line per row as far as it fits."""


def output_width() -> int:
    """The terminal's width when stdout is one, else :data:`WIDE`."""
    if sys.stdout.isatty():
        return shutil.get_terminal_size((WIDE, 24)).columns
    return WIDE


def printable(text: str) -> str:
    """``text`` with its control and format characters escaped (``\\x1b``, ``\\u200b``); its
    line breaks kept."""
    return "".join(
        char if char.isprintable() or char == "\n" else char.encode("unicode_escape").decode()
        for char in text
    )


def table_text(
    columns: Sequence[str],
    rows: Iterable[Sequence[object]],
    *,
    caption: str | None = None,
    right: Sequence[str] = (),
    width: int = WIDE,
) -> str:
    """``rows`` under ``columns`` as a rich table's text (``None`` shown as ``-``, every cell
    :func:`printable`); the columns named in ``right`` (numbers) aligned right."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    table = Table(caption=caption)
    for name in columns:
        table.add_column(name, justify="right" if name in right else "left", overflow="fold")
    for row in rows:
        table.add_row(*(Text("-" if cell is None else printable(str(cell))) for cell in row))
    buffer = io.StringIO()
    Console(file=buffer, width=width, highlight=False, emoji=False).print(table)
    return buffer.getvalue()


def json_value(value: Any) -> Any:
    """What ``json.dumps`` cannot write, as text: times in ISO 8601, decimals exact."""
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, Decimal):
        return format(value, "f")
    if isinstance(value, UUID | PurePath):
        return str(value)
    if isinstance(value, bytes):
        return value.decode("utf-8", "backslashreplace")
    raise TypeError(f"no JSON for {type(value).__name__}")


def json_text(document: Any) -> str:
    """``document`` as indented JSON text, one newline at the end."""
    return json.dumps(document, indent=2, default=json_value) + "\n"


def print_rows(
    columns: Sequence[str],
    rows: Sequence[Sequence[object]],
    *,
    caption: str | None = None,
    right: Sequence[str] = (),
) -> None:
    """Print ``rows`` as a table on stdout, or nothing when there are none."""
    if rows:
        text = table_text(columns, rows, caption=caption, right=right, width=output_width())
        typer.echo(text, nl=False)


def print_json(document: Any) -> None:
    typer.echo(json_text(document), nl=False)


def summary(line: str) -> None:
    """The command's one summary line, on stderr (stdout keeps only the rows)."""
    typer.echo(line, err=True)
