"""``outbox consumer dead-letters`` without services: which dead letters a replay refuses (their
stored record is not the one Kafka delivered), how ``show`` prints bytes, and the command
line's own refusals (they come before anything connects). The commands against PostgreSQL and
Kafka: tests/integration/test_consumer_dead_letters.py."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import pytest
from typer.testing import CliRunner

from outbox.consumer_dead_letters import replay_refusal
from outbox.core.protocol import conflict_reason
from outbox_cli.consumer import _bytes_text, _escaped
from outbox_cli.main import app

EVENT_ID = str(uuid.uuid4())
CONTRACT_HEADERS = [
    ("id", EVENT_ID),
    ("eventType", "OrderPlaced"),
    ("traceparent", ""),
    ("headers", '{"tenant": "é"}'),
    ("position", "7"),
]


def stored(headers: list[tuple[str, bytes | None]]) -> list[tuple[str, str | None]]:
    """The headers as IdempotentConsumer keeps them (outbox.core.protocol.dead_letter_message),
    read back from jsonb."""
    from outbox.core.text import storable_text

    text = json.dumps(
        [
            [
                storable_text(name),
                None if v is None else storable_text(v.decode("utf-8", "replace")),
            ]
            for name, v in headers
        ]
    )
    return [(name, value) for name, value in json.loads(text)]


def test_a_faithfully_kept_record_may_be_replayed() -> None:
    assert replay_refusal(EVENT_ID, CONTRACT_HEADERS, False, False, "RuntimeError: x") is None
    # A record that was no outbox event, kept whole, too: it is produced again as it came.
    kept = stored([("eventType", b"X"), ("source", "caf\u00e9".encode())])
    assert replay_refusal(None, kept, False, False, "not an outbox record: ...") is None
    assert replay_refusal(None, [], True, False) is None  # no key: a value alone is fine


@pytest.mark.parametrize(
    ("headers", "event_id", "says"),
    [
        ([("id", b"x"), ("trace", b"\xff\xfe")], EVENT_ID, "U+FFFD"),  # not UTF-8
        ([("blob", b"a\x00b")], None, "U+FFFD"),  # NUL: PostgreSQL keeps U+FFFD
        ([("we\x00ird", b"1")], None, "U+FFFD"),
        # A header name that is not UTF-8: the reader escaped it (outbox._lenient_records).
        ([("ok", b"1"), (b"\xff\xfe".decode("utf-8", "backslashreplace"), b"v")], None, "escaped"),
        ([("nothing", None)], EVENT_ID, "no value"),
    ],
    ids=["value not UTF-8", "NUL in a value", "NUL in a name", "name not UTF-8", "null value"],
)
def test_a_record_not_kept_as_delivered_is_refused_with_the_reason(
    headers: list[tuple[str, bytes | None]], event_id: str | None, says: str
) -> None:
    refusal = replay_refusal(event_id, stored(headers), False, False)
    assert refusal is not None and says in refusal
    assert "discard it" in refusal


def test_a_backslash_in_a_decoded_records_header_name_is_its_own() -> None:
    """Only a record that could not be read (no event id) had its names escaped."""
    assert replay_refusal(EVENT_ID, [("a\\b", "1")], False, False) is None


def test_a_record_without_key_and_value_and_a_conflicting_copy_are_refused() -> None:
    nothing = replay_refusal(None, [], True, True)
    assert nothing is not None and "neither key nor value" in nothing
    conflict = replay_refusal(EVENT_ID, CONTRACT_HEADERS, False, False, conflict_reason(EVENT_ID))
    assert conflict is not None and "reused or forged" in conflict
    # The same event's dead letter for another reason is no conflict.
    assert replay_refusal(EVENT_ID, CONTRACT_HEADERS, False, False, "ValueError: x") is None


def test_show_prints_bytes_as_text_with_what_a_terminal_acts_on_escaped() -> None:
    assert _bytes_text(None) == "(null)"
    assert _bytes_text(b'{"n": 1}') == '{"n": 1}'
    assert _bytes_text(b"caf\xc3\xa9 \xff\xfe") == "caf\u00e9 \\xff\\xfe"
    assert _bytes_text(b"\x1b[2Jhi\n\tthere") == "\\x1b[2Jhi\\n\\tthere"
    assert _bytes_text(b"line\nnext\ttab", keep="\n\t") == "line\nnext\ttab"
    assert _escaped("zero\u200bwidth") == "zero\\u200bwidth"


@pytest.fixture
def no_settings(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    import os

    for name in list(os.environ):
        if name.startswith("OUTBOX_"):
            monkeypatch.delenv(name)
    yield


@pytest.mark.usefixtures("no_settings")
@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["replay", "shipping"], "or --all"),
        (["replay", "shipping", "t", "0", "1", "--all"], "not both"),
        (["replay", "shipping", "t", "0"], "all three"),
        (["discard", "shipping", "--all"], "every dead letter of shipping for good"),
        (["discard", "shipping", "t", "0", "1"], "shipping t[0]@1 for good"),
    ],
)
def test_the_command_line_refuses_before_anything_connects(args: list[str], says: str) -> None:
    """(No OUTBOX_DATABASE_URL is set: a command that went on would say so instead.)"""
    result = CliRunner().invoke(app, ["consumer", "dead-letters", *args])
    assert result.exit_code == 2, (result.stdout, result.stderr)
    [line] = result.stderr.splitlines()
    assert says in line
    if args[0] == "discard":
        assert "--yes" in line
