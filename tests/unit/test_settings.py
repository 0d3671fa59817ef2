"""Settings are read from OUTBOX_* variables and refused with the variable's name."""

from __future__ import annotations

from datetime import timedelta

import pytest
from pydantic import ValidationError

from outbox import OutboxSettings
from outbox.settings import DatabaseSettings, describe_validation_error


def test_settings_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OUTBOX_SCHEMA_NAME", "events")
    monkeypatch.setenv("OUTBOX_DEDUP_WINDOW", "3600")
    settings = OutboxSettings()
    assert settings.tables.qualified_outbox == '"events"."outbox"'
    assert settings.dedup_window == timedelta(hours=1)


def test_an_unsafe_table_name_is_refused_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OUTBOX_TABLE", "outbox; drop table users")
    with pytest.raises(ValidationError) as raised:
        OutboxSettings()
    message = describe_validation_error(raised.value)
    assert "OUTBOX_TABLE" in message and "plain SQL identifier" in message


def test_database_url_is_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OUTBOX_DATABASE_URL", "postgresql+psycopg://app:hunter2@db/shop")
    settings = DatabaseSettings()  # type: ignore[call-arg]
    assert "hunter2" not in repr(settings) and "hunter2" not in str(settings)
    monkeypatch.setenv("OUTBOX_DATABASE_URL", "mysql://x")
    with pytest.raises(ValidationError, match="PostgreSQL URL"):
        DatabaseSettings()  # type: ignore[call-arg]
