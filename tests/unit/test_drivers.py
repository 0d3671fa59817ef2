"""SQLAlchemy must run on psycopg 3: plain ``postgresql://`` URLs are given it, other drivers are
refused with the fix, and an engine on another driver is refused when it publishes."""

from __future__ import annotations

import pytest

from outbox import ConfigurationError, UnsupportedTransactionError, sqlalchemy_url
from outbox._drivers import _check_sqlalchemy_driver


@pytest.mark.parametrize(
    ("given", "used"),
    [
        ("postgresql://app:pw@db/shop", "postgresql+psycopg://app:pw@db/shop"),
        (
            "postgres://app@db/shop?sslmode=require",
            "postgresql+psycopg://app@db/shop?sslmode=require",
        ),
        ("postgresql+psycopg://app@db/shop", "postgresql+psycopg://app@db/shop"),
        ("postgresql+psycopg_async://app@db/shop", "postgresql+psycopg_async://app@db/shop"),
    ],
)
def test_postgresql_urls_get_the_psycopg_3_driver(given: str, used: str) -> None:
    assert sqlalchemy_url(given) == used


@pytest.mark.parametrize(
    ("given", "named"),
    [
        ("postgresql+psycopg2://app:pw@db/shop", "psycopg2"),
        ("postgresql+asyncpg://app:pw@db/shop", "asyncpg"),
        ("mysql://app:pw@db/shop", "not a PostgreSQL URL"),
        ("db/shop", "not a PostgreSQL URL"),
    ],
)
def test_other_urls_are_refused_naming_the_fix_and_never_the_password(
    given: str, named: str
) -> None:
    with pytest.raises(ConfigurationError, match=named) as raised:
        sqlalchemy_url(given)
    assert "postgresql+psycopg://" in str(raised.value)
    assert "pw" not in str(raised.value)


class Psycopg2Connection:
    """Stands for the DBAPI connection of an engine made with ``postgresql://`` (psycopg2)."""

    __module__ = "psycopg2.extensions"


def test_an_engine_on_another_driver_is_refused_naming_the_driver_and_the_fix() -> None:
    with pytest.raises(UnsupportedTransactionError) as raised:
        _check_sqlalchemy_driver(Psycopg2Connection())
    message = str(raised.value)
    assert "psycopg2" in message
    assert "postgresql+psycopg://" in message and "sqlalchemy_url" in message
