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


@pytest.mark.parametrize(
    ("given", "used"),
    [
        ("postgresql://app:pw@db:5432/shop", "postgresql+psycopg://app:pw@db:5432/shop"),
        ("postgres://app:pw@db/shop", "postgresql+psycopg://app:pw@db/shop"),
        ("postgresql+psycopg://app@db/shop", "postgresql+psycopg://app@db/shop"),
    ],
)
def test_a_plain_postgresql_url_gets_the_psycopg_driver(
    monkeypatch: pytest.MonkeyPatch, given: str, used: str
) -> None:
    """SQLAlchemy reads ``postgresql://`` as psycopg2, which the project neither installs nor
    supports: the setting means psycopg 3, the one driver the SDK runs on."""
    monkeypatch.setenv("OUTBOX_DATABASE_URL", given)
    assert DatabaseSettings().database_url.get_secret_value() == used  # type: ignore[call-arg]


@pytest.mark.parametrize("driver", ["psycopg2", "asyncpg", "pg8000"])
def test_another_driver_is_refused_with_the_fix(
    monkeypatch: pytest.MonkeyPatch, driver: str
) -> None:
    monkeypatch.setenv("OUTBOX_DATABASE_URL", f"postgresql+{driver}://app:pw@db/shop")
    with pytest.raises(ValidationError, match=rf"{driver}.*postgresql\+psycopg://") as raised:
        DatabaseSettings()  # type: ignore[call-arg]
    assert "pw@" not in str(raised.value)
