"""Debezium's TLS options reach the connector's configuration when their settings are set,
and only then; settings that cannot work are refused, naming the variable."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from outbox import OutboxSettings
from outbox_connect import ConnectorSettings, render_connector_config


def test_tls_options_are_rendered_when_set() -> None:
    settings = ConnectorSettings(
        database_sslmode="verify-full", database_sslrootcert="/etc/outbox/pg-ca.crt"
    )
    config = render_connector_config(settings, OutboxSettings())
    assert config["database.sslmode"] == "verify-full"
    assert config["database.sslrootcert"] == "/etc/outbox/pg-ca.crt"


def test_tls_options_are_left_to_debezium_when_unset() -> None:
    config = render_connector_config(ConnectorSettings(), OutboxSettings())
    assert not [key for key in config if key.startswith("database.ssl")]
    only_mode = render_connector_config(
        ConnectorSettings(database_sslmode="require"), OutboxSettings()
    )
    assert only_mode["database.sslmode"] == "require" and "database.sslrootcert" not in only_mode


def test_tls_settings_are_read_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OUTBOX_CONNECT_DATABASE_SSLMODE", "verify-full")
    monkeypatch.setenv("OUTBOX_CONNECT_DATABASE_SSLROOTCERT", "/ca.crt")
    settings = ConnectorSettings()
    assert (settings.database_sslmode, settings.database_sslrootcert) == ("verify-full", "/ca.crt")


@pytest.mark.parametrize(
    ("values", "says"),
    [
        ({"database_sslmode": "verify-everything"}, "verify-full"),
        ({"database_sslmode": "verify-full", "database_sslrootcert": "ca.crt"}, "absolute path"),
        ({"database_sslrootcert": "/ca.crt"}, "OUTBOX_CONNECT_DATABASE_SSLMODE=verify-full"),
        (
            {"database_sslmode": "require", "database_sslrootcert": "/ca.crt"},
            "OUTBOX_CONNECT_DATABASE_SSLMODE=verify-full",
        ),
    ],
)
def test_tls_settings_that_cannot_work_are_refused(values: dict[str, str], says: str) -> None:
    with pytest.raises(ValidationError, match=says):
        ConnectorSettings(**values)  # type: ignore[arg-type]
