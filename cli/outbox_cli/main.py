"""``outbox``: one command for the SDK's database objects, the local stack and the main job.

Subcommands import what they need when they run, so ``outbox --help`` stays fast. Every
command accepts ``--verbose``/``-v`` and runs inside
:func:`outbox_cli._common.friendly_errors`: an error ends it with one readable line (the traceback
too with ``--verbose``). Both are applied to the whole tree when this module is imported, so
a new command gets them without a line of its own.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

import typer

from outbox_cli import (
    connect,
    console,
    consumer,
    db,
    demo,
    effects,
    lake,
    reconcile,
    relay,
    stack,
)
from outbox_cli._common import DISTRIBUTION, friendly_errors, show_tracebacks

app = typer.Typer(
    name="outbox",
    help="Transactional outbox for PostgreSQL: migrations, the local stack, the demo.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _print_version(wanted: bool) -> None:
    if wanted:
        from importlib.metadata import version

        typer.echo(f"{DISTRIBUTION} {version(DISTRIBUTION)}")
        raise typer.Exit()


@app.callback()
def main(
    _version: bool = typer.Option(
        False,
        "--version",
        callback=_print_version,
        is_eager=True,
        help="Print the installed version (outbox-relay X.Y.Z) and exit.",
    ),
) -> None:
    """Transactional outbox for PostgreSQL: migrations, the local stack, the demo."""


app.add_typer(stack.app, name="stack")
app.add_typer(db.app, name="db")
app.add_typer(connect.app, name="connect")
app.add_typer(relay.app, name="relay")
app.add_typer(lake.app, name="lake")
app.add_typer(effects.app, name="effects")
app.add_typer(consumer.app, name="consumer")
app.command("demo")(demo.run_demo)
app.command("console")(console.run_console)
reconcile.register(app)


VERBOSE_OPTION = typer.Option(False, "--verbose", "-v", help="On error, print the traceback too.")


def _with_friendly_errors(callback: Callable[..., Any], path: str) -> Callable[..., Any]:
    """``callback`` (the command ``path``, ``outbox relay run``) run inside
    :func:`friendly_errors`, with a ``--verbose`` flag when it has none of its own (the
    signature Typer reads gets one more keyword)."""
    signature = inspect.signature(callback, eval_str=True)
    own_verbose = "verbose" in signature.parameters

    @functools.wraps(callback)
    def run(*args: Any, **kwargs: Any) -> Any:
        verbose = kwargs.get("verbose", False) if own_verbose else kwargs.pop("verbose", False)
        show_tracebacks(bool(verbose))
        with friendly_errors(path):
            return callback(*args, **kwargs)

    if not own_verbose:
        verbose = inspect.Parameter(
            "verbose", inspect.Parameter.KEYWORD_ONLY, default=VERBOSE_OPTION, annotation=bool
        )
        run.__signature__ = signature.replace(  # type: ignore[attr-defined]
            parameters=[*signature.parameters.values(), verbose]
        )
    run.__outbox_friendly__ = True  # type: ignore[attr-defined]
    return run


def _apply_to_tree(typer_app: typer.Typer, path: str) -> None:
    """Friendly errors and ``--verbose`` for every command of ``typer_app`` and its groups."""
    for info in typer_app.registered_commands:
        if info.callback is not None and not hasattr(info.callback, "__outbox_friendly__"):
            name = info.name or info.callback.__name__.replace("_", "-")
            info.callback = _with_friendly_errors(info.callback, f"{path} {name}")
    for group in typer_app.registered_groups:
        if group.typer_instance is not None:
            _apply_to_tree(group.typer_instance, f"{path} {group.name}")


_apply_to_tree(app, "outbox")


if __name__ == "__main__":  # pragma: no cover
    app()
