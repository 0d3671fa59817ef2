"""What every subcommand shares: turning our errors into a readable exit."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TypeVar

import typer
from pydantic import ValidationError
from pydantic_settings import BaseSettings
from sqlalchemy.exc import DBAPIError

from outbox.core.errors import OutboxError
from outbox.settings import describe_validation_error

S = TypeVar("S", bound=BaseSettings)


@contextmanager
def friendly_errors() -> Iterator[None]:
    """Exit with status 2 and a one-paragraph message for configuration and stack errors."""
    try:
        yield
    except ValidationError as error:
        typer.secho(describe_validation_error(error), err=True, fg=typer.colors.RED)
        raise typer.Exit(2) from None
    except OutboxError as error:
        typer.secho(f"error: {error}", err=True, fg=typer.colors.RED)
        raise typer.Exit(2) from None
    except DBAPIError as error:
        # The driver's own message; SQLAlchemy's wrapper would add the statement text.
        typer.secho(f"database error: {error.orig}", err=True, fg=typer.colors.RED)
        raise typer.Exit(2) from None


def load(settings_class: type[S]) -> S:
    """Read a settings class from the environment; exit with a readable message if invalid."""
    try:
        return settings_class()
    except ValidationError as error:
        prefix = str(settings_class.model_config.get("env_prefix", ""))
        typer.secho(describe_validation_error(error, env_prefix=prefix), err=True, fg="red")
        raise typer.Exit(2) from None


def configure_logging(verbose: bool) -> None:
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
