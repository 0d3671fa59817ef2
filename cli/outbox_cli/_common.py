"""What every subcommand shares: settings, the broker's address, and readable errors.

Every command runs inside :func:`friendly_errors` (``outbox_cli.main`` wraps each one): an error a
user can meet ends the command with one line on stderr naming the setting, the service or
the reason, never a traceback, unless ``--verbose`` was given (every command accepts it),
which prints the traceback first. Exit status: 2 for what the user can fix (a bad setting,
an unreachable service, an operation refused: every :class:`OutboxError`; a library of an
extra that is not installed, named with the extra to install), 1 for anything unexpected (a
bug: the line says so and names ``--verbose``); a command's own 1 (a status that is down, a
job that stopped) is unchanged.
"""

from __future__ import annotations

import logging
import sys
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, TypeVar

import typer
from pydantic import ValidationError
from pydantic_settings import BaseSettings

from outbox.core.errors import ConfigurationError, OutboxError

if TYPE_CHECKING:
    from outbox.settings import KafkaSettings

S = TypeVar("S", bound=BaseSettings)

USER_ERROR = 2
UNEXPECTED_ERROR = 1
MAX_LINE = 600  # a log tail in a message is cut here; --verbose prints the whole error
DISTRIBUTION = "outbox-relay"

# The libraries only an extra installs (pyproject.toml), by import name, each with the
# smallest extra that installs it; tests/unit/test_extras.py keeps this in step with the
# imports of each extra's modules. A command that meets one missing names the extra.
EXTRA_OF_LIBRARY = {
    "kafka": "relay",
    "crc32c": "relay",
    "prometheus_client": "relay",
    "pythonjsonlogger": "relay",
    "pyspark": "lake",
    "py4j": "lake",
    "deltalake": "lake",
    "delta": "lake",
    "pyarrow": "lake",
    "pandas": "lake",
    "numpy": "lake",
    "duckdb": "lake",
    "starlette": "console",
    "jinja2": "console",
    "uvicorn": "console",
    "multipart": "console",
}


class _Verbosity:
    """Whether errors show their traceback: set by ``--verbose`` on any command."""

    tracebacks = False


def show_tracebacks(on: bool) -> None:
    _Verbosity.tracebacks = on


def fail(message: str, error: BaseException | None = None, code: int = USER_ERROR) -> typer.Exit:
    """Print ``message`` as one red line (after ``error``'s traceback with ``--verbose``);
    the :class:`typer.Exit` to raise."""
    if error is not None and _Verbosity.tracebacks:
        traceback.print_exception(error, file=sys.stderr)
    line = " ".join(message.split())
    if len(line) > MAX_LINE:
        line = line[: MAX_LINE - 40].rstrip() + " ... (--verbose shows it all)"
    typer.secho(line, err=True, fg=typer.colors.RED)
    return typer.Exit(code)


def describe(error: Exception, command: str | None = None) -> tuple[str, int] | None:
    """The one line for an error a user can meet, and its exit status; None for a bug.
    ``command`` (``outbox relay run``) is named when its extra is missing."""
    if isinstance(error, ValidationError):
        return f"error: invalid settings: {_settings_problems(error, 'OUTBOX_')}", USER_ERROR
    if isinstance(error, OutboxError):
        return f"error: {error}", USER_ERROR
    if (
        isinstance(error, ModuleNotFoundError)
        and (missing := missing_extra(error, command)) is not None
    ):
        return missing, USER_ERROR
    names = {cls.__module__.split(".")[0] for cls in type(error).__mro__}
    if names & {"sqlalchemy", "psycopg"}:
        from outbox.database_errors import database_error

        refused = database_error(error)  # TLS refused: which failure, and its fix
        if refused is not None:
            return f"error: {refused}", USER_ERROR
    if "sqlalchemy" in names:
        # The driver's own message; SQLAlchemy's wrapper would add the statement text.
        return f"database error: {getattr(error, 'orig', None) or error}", USER_ERROR
    if "psycopg" in names:
        return f"database error: {error}", USER_ERROR
    if "kafka" in names:
        return f"Kafka error: {type(error).__name__}: {error}", USER_ERROR
    if isinstance(error, OSError):  # refused, timed out, unreadable: the reason is the fix
        return f"error: {type(error).__name__}: {error}", USER_ERROR
    return None


def missing_extra(error: ModuleNotFoundError, command: str | None = None) -> str | None:
    """The line for a library an extra installs that is missing: the command, the extra and
    the ``pip install`` that brings it; None when the module is none of the extras'."""
    library = (error.name or "").split(".")[0]
    extra = EXTRA_OF_LIBRARY.get(library)
    if extra is None:
        return None
    command = f"`{command}`" if command else "this command"
    return (
        f"error: {command} needs the {extra} extra ({library} is not installed): "
        f"pip install '{DISTRIBUTION}[{extra}]' (from a clone: pip install -e '.[{extra}]')"
    )


@contextmanager
def friendly_errors(command: str | None = None) -> Iterator[None]:
    """Turn any exception into one readable line and an exit status (see the module);
    ``command`` is the command's path, ``outbox relay run``."""
    try:
        yield
    except (typer.Exit, typer.Abort):
        raise
    except Exception as error:
        described = describe(error, command)
        if described is None:
            message = (
                f"unexpected error: {type(error).__name__}: {error} "
                "(run the command again with --verbose for the traceback, and report it)"
            )
            raise fail(message, error, UNEXPECTED_ERROR) from None
        raise fail(described[0], error, described[1]) from None


def load(settings_class: type[S]) -> S:
    """Read a settings class from the environment; a :class:`ConfigurationError` naming
    each bad variable if invalid."""
    try:
        return settings_class()
    except ValidationError as error:
        prefix = str(settings_class.model_config.get("env_prefix", ""))
        raise ConfigurationError(
            f"invalid settings: {_settings_problems(error, prefix)}"
        ) from error


def _settings_problems(error: ValidationError, prefix: str) -> str:
    problems = []
    for item in error.errors():
        name = "_".join(str(part) for part in item["loc"]).upper()
        # A rule over several settings (no location) names them in its message.
        problems.append(f"{prefix}{name}: {item['msg']}" if name else str(item["msg"]))
    return "; ".join(problems)


def kafka_settings() -> KafkaSettings:
    """The Kafka cluster and how to reach it (``OUTBOX_KAFKA_*``, security included), its
    servers the local stack's broker when OUTBOX_KAFKA_BOOTSTRAP_SERVERS is not set."""
    from outbox.settings import KafkaSettings
    from outbox_stack.settings import StackSettings

    kafka = load(KafkaSettings)
    if kafka.bootstrap_servers is None:
        return kafka.with_servers(load(StackSettings).bootstrap_servers)
    return kafka


def configure_logging(verbose: bool) -> None:
    show_tracebacks(verbose)
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        force=True,  # the standard error of this invocation, not of an earlier one
    )
