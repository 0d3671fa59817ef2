"""Identifier validation: nothing that is not a plain identifier gets through."""

from __future__ import annotations

import string

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from outbox.core.errors import InvalidIdentifierError
from outbox.core.identifiers import quote_identifier, validate_identifier
from outbox.core.tables import OutboxTables

PLAIN_FIRST = set(string.ascii_lowercase + "_")
PLAIN_REST = PLAIN_FIRST | set(string.digits)


def is_plain(name: str) -> bool:
    """The definition, written independently of the implementation's regex."""
    return (
        0 < len(name) <= 63
        and name[0] in PLAIN_FIRST
        and all(character in PLAIN_REST for character in name)
    )


@given(st.text(max_size=80))
@example('x"; DROP TABLE users; --')
@example("outbox\n")
@example("Outbox")
@example("1table")
@example("\uff41bc")  # full-width letter
@example("a" * 64)
@example("")
def test_only_plain_identifiers_pass(name: str) -> None:
    if is_plain(name):
        assert validate_identifier(name, field="table") == name
        assert quote_identifier(name, field="table") == f'"{name}"'
    else:
        with pytest.raises(InvalidIdentifierError, match="table"):
            validate_identifier(name, field="table")


@given(st.from_regex(r"[a-z_][a-z0-9_]{0,62}", fullmatch=True))
def test_every_plain_identifier_passes(name: str) -> None:
    assert validate_identifier(name, field="schema") == name


def test_non_strings_are_refused() -> None:
    with pytest.raises(InvalidIdentifierError, match="must be a string"):
        validate_identifier(7, field="schema")


def test_table_names_are_checked_when_built() -> None:
    with pytest.raises(InvalidIdentifierError, match="outbox table"):
        OutboxTables(outbox="Outbox Events")
    assert OutboxTables().qualified_outbox == '"outbox"."outbox"'
