"""The console's security: who may read it, and which requests may act. No service is
needed: the pages under test read fakes (no panel, dead letters from a fake store), in
process through Starlette's test client."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from outbox.core.errors import ConfigurationError
from outbox.settings import KafkaSettings, OutboxSettings
from outbox_cli._common import load
from outbox_connect.settings import ConnectorSettings
from outbox_console import Console, ConsoleSettings, Guard, Pipeline, create_app, read_token
from outbox_console.dead_letters import Letters, Outcome
from outbox_console.security import COOKIE
from outbox_lake.settings import LakeSettings
from outbox_relay.dead_letters import DeadLetter

TOKEN = "a-token-of-the-console-0123456789"
LETTER = DeadLetter(
    uuid.UUID("0190c5a8-9c1e-7000-8000-000000000001"),
    "order",
    "o-1",
    "OrderPlaced",
    "MessageSizeTooLargeError",
    datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC),
    20_000,
)


class FakeStore:
    """The dead letters, without a database: one of the relay's; actions recorded."""

    def __init__(self) -> None:
        self.done: list[tuple[str, Any]] = []

    def listing(self) -> Letters:
        return Letters([LETTER], [])

    def relay_letter(self, event_id: uuid.UUID) -> DeadLetter | None:
        return LETTER if event_id == LETTER.id else None

    def replay_relay(self, event_id: uuid.UUID) -> Outcome:
        self.done.append(("replay", event_id))
        return Outcome(True, f"dead letter {event_id} is back in the outbox")

    def discard_relay(self, event_id: uuid.UUID) -> Outcome:
        self.done.append(("discard", event_id))
        return Outcome(True, f"dead letter {event_id} discarded")


@pytest.fixture
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for name in list(os.environ):
        if name.startswith("OUTBOX_CONSOLE_"):
            monkeypatch.delenv(name)


def console_for(
    tmp_path: Path, store: FakeStore, *, token: str | None = None, actions: bool = False
) -> TestClient:
    settings = ConsoleSettings(allow_actions=actions)
    pipeline = Pipeline(
        console=settings,
        database_url="postgresql+psycopg://u:p@127.0.0.1:1/x",
        outbox=OutboxSettings(),
        connector=ConnectorSettings(),
        kafka=KafkaSettings(bootstrap_servers="127.0.0.1:1"),
        lake=LakeSettings(root=str(tmp_path / "lake")),
    )
    console = Console(pipeline, Guard(token), store=store, watches=[])  # type: ignore[arg-type]
    return TestClient(create_app(console), base_url="http://127.0.0.1:58088")


@pytest.fixture
def store() -> FakeStore:
    return FakeStore()


@pytest.fixture
def open_console(tmp_path: Path, store: FakeStore) -> Iterator[TestClient]:
    with console_for(tmp_path, store) as client:
        yield client


@pytest.fixture
def guarded(tmp_path: Path, store: FakeStore) -> Iterator[TestClient]:
    with console_for(tmp_path, store, token=TOKEN, actions=True) as client:
        yield client


@pytest.mark.usefixtures("clean_environment")
@pytest.mark.parametrize("host", ["0.0.0.0", "192.0.2.10", "console.example", "::"])
def test_off_loopback_without_a_token_file_it_refuses_to_start_naming_the_fix(
    host: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OUTBOX_CONSOLE_HOST", host)
    with pytest.raises(ConfigurationError) as refused:
        load(ConsoleSettings)
    message = str(refused.value)
    assert "OUTBOX_CONSOLE_TOKEN_FILE" in message and "127.0.0.1" in message


@pytest.mark.usefixtures("clean_environment")
@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "::1", "localhost"])
def test_on_loopback_no_token_is_needed(host: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OUTBOX_CONSOLE_HOST", host)
    settings = load(ConsoleSettings)
    assert settings.token_file is None and not settings.allow_actions


@pytest.mark.usefixtures("clean_environment")
def test_settings_read_the_relays_comma_separated_and_refuse_other_schemes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OUTBOX_CONSOLE_RELAY_URLS", "http://a:8090, http://b:8090")
    assert load(ConsoleSettings).relay_urls == ["http://a:8090", "http://b:8090"]
    monkeypatch.setenv("OUTBOX_CONSOLE_RELAY_URLS", "ftp://a")
    with pytest.raises(ConfigurationError, match="OUTBOX_CONSOLE_RELAY_URLS"):
        load(ConsoleSettings)


def test_the_token_file_must_hold_a_long_enough_token(tmp_path: Path) -> None:
    short = tmp_path / "short"
    short.write_text("abc\n")
    with pytest.raises(ConfigurationError, match="OUTBOX_CONSOLE_TOKEN_FILE") as refused:
        read_token(short)
    assert "abc" not in str(refused.value)  # never the token, even a bad one
    with pytest.raises(ConfigurationError, match="OUTBOX_CONSOLE_TOKEN_FILE"):
        read_token(tmp_path / "missing")
    good = tmp_path / "good"
    good.write_text(f"{TOKEN}\n")
    assert read_token(good) == TOKEN


def test_without_a_token_only_loopback_names_are_answered(open_console: TestClient) -> None:
    assert open_console.get("/").status_code == 200
    assert open_console.get("/", headers={"Host": "localhost:58088"}).status_code == 200
    # A name of another site made to point at 127.0.0.1 (DNS rebinding) reads nothing.
    rebound = open_console.get("/", headers={"Host": "attacker.example:58088"})
    assert rebound.status_code == 421 and "pipeline" not in rebound.text


def test_with_a_token_every_page_needs_it(guarded: TestClient) -> None:
    for path in ("/", "/fragments/overview", "/events", "/dead-letters"):
        answer = guarded.get(path)
        assert answer.status_code == 401, path
        assert 'action="/login"' in answer.text
    wrong = guarded.get("/", headers={"Authorization": "Bearer not-the-token-at-all"})
    assert wrong.status_code == 401
    assert guarded.get("/", headers={"Authorization": f"Basic {TOKEN}"}).status_code == 401
    right = guarded.get("/", headers={"Authorization": f"Bearer {TOKEN}"})
    assert right.status_code == 200
    assert guarded.get("/static/console.css").status_code == 200  # no secret in a stylesheet
    htmx = guarded.get("/fragments/overview", headers={"HX-Request": "true"})
    assert htmx.status_code == 401 and htmx.headers["HX-Redirect"] == "/login"


def test_the_login_form_sets_a_strict_http_only_cookie_that_is_not_the_token(
    guarded: TestClient,
) -> None:
    wrong = guarded.post("/login", data={"token": "not-the-token-at-all"}, follow_redirects=False)
    assert wrong.status_code == 401 and COOKIE not in wrong.cookies
    signed = guarded.post("/login", data={"token": TOKEN}, follow_redirects=False)
    assert signed.status_code == 303
    cookie = signed.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie
    assert TOKEN not in cookie
    assert guarded.get("/").status_code == 200  # the client keeps the cookie
    out = guarded.post("/logout", follow_redirects=False)
    assert out.status_code == 303
    guarded.cookies.clear()
    assert guarded.get("/").status_code == 401


def test_the_token_is_in_no_page_header_or_log(
    guarded: TestClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("DEBUG")
    answers = [
        guarded.post("/login", data={"token": TOKEN}, follow_redirects=False),
        guarded.get("/"),
        guarded.get("/dead-letters"),
        guarded.get("/", headers={"Authorization": f"Bearer {TOKEN}"}),
    ]
    for answer in answers:
        assert TOKEN not in answer.text
        assert all(TOKEN not in value for value in answer.headers.values())
    assert TOKEN not in caplog.text


def test_actions_do_not_exist_unless_allowed(open_console: TestClient, store: FakeStore) -> None:
    page = open_console.get("/dead-letters")
    assert page.status_code == 200 and str(LETTER.id) in page.text
    assert "<button" not in page.text and "/actions/" not in page.text
    assert "/actions/" not in open_console.get(f"/dead-letters/relay/{LETTER.id}").text
    for path in ("/actions/relay/replay", "/actions/relay/discard"):
        answer = open_console.post(path, data={"event_id": str(LETTER.id)})
        assert answer.status_code == 404, path
    assert store.done == []


def _csrf(page: str) -> str:
    found = re.search(r'name="csrf" value="([0-9a-f]+)"', page)
    assert found, page
    return found.group(1)


def test_an_action_needs_the_pages_csrf_token(guarded: TestClient, store: FakeStore) -> None:
    guarded.post("/login", data={"token": TOKEN})
    page = guarded.get("/dead-letters").text
    assert 'action="/actions/relay/replay"' in page
    form = {"event_id": str(LETTER.id)}
    for csrf in (None, "0" * 64):
        data = form if csrf is None else {**form, "csrf": csrf}
        refused = guarded.post("/actions/relay/replay", data=data, follow_redirects=False)
        assert refused.status_code == 403
    assert store.done == []
    done = guarded.post(
        "/actions/relay/replay", data={**form, "csrf": _csrf(page)}, follow_redirects=False
    )
    assert done.status_code == 303
    assert store.done == [("replay", LETTER.id)]
    shown = guarded.get(done.headers["location"])
    assert f"dead letter {LETTER.id} is back in the outbox" in shown.text


def test_a_csrf_token_of_another_session_is_refused(tmp_path: Path, store: FakeStore) -> None:
    with console_for(tmp_path, store, actions=True) as client:
        page = client.get("/dead-letters").text
        # Another console process (another key) made this one: refused here.
        with console_for(tmp_path, FakeStore(), actions=True) as other:
            foreign = _csrf(other.get("/dead-letters").text)
        data = {"event_id": str(LETTER.id), "csrf": foreign}
        assert client.post("/actions/relay/replay", data=data).status_code == 403
        data["csrf"] = _csrf(page)
        assert client.post("/actions/relay/replay", data=data).status_code == 200
    assert store.done == [("replay", LETTER.id)]


def test_a_script_with_the_bearer_token_needs_no_csrf(
    guarded: TestClient, store: FakeStore
) -> None:
    answer = guarded.post(
        "/actions/relay/replay",
        data={"event_id": str(LETTER.id)},
        headers={"Authorization": f"Bearer {TOKEN}"},
        follow_redirects=False,
    )
    assert answer.status_code == 303 and store.done == [("replay", LETTER.id)]


def test_discarding_needs_the_box_ticked(guarded: TestClient, store: FakeStore) -> None:
    guarded.post("/login", data={"token": TOKEN})
    csrf = _csrf(guarded.get("/dead-letters").text)
    form = {"event_id": str(LETTER.id), "csrf": csrf}
    unticked = guarded.post("/actions/relay/discard", data=form)
    assert "tick the box" in unticked.text and store.done == []
    guarded.post("/actions/relay/discard", data={**form, "yes": "on"})
    assert store.done == [("discard", LETTER.id)]


def test_pages_forbid_framing_and_foreign_scripts(open_console: TestClient) -> None:
    headers = open_console.get("/").headers
    assert headers["X-Frame-Options"] == "DENY"
    assert "frame-ancestors 'none'" in headers["Content-Security-Policy"]
    assert "default-src 'self'" in headers["Content-Security-Policy"]
