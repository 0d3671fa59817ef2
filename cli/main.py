"""``outbox``: one command for the SDK's database objects, the local stack and the main job.

Subcommands import what they need when they run, so ``outbox --help`` stays fast.
"""

from __future__ import annotations

import typer

from cli import connect, db, demo, effects, lake, relay, stack

app = typer.Typer(
    name="outbox",
    help="Transactional outbox for PostgreSQL: migrations, the local stack, the demo.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)
app.add_typer(stack.app, name="stack")
app.add_typer(db.app, name="db")
app.add_typer(connect.app, name="connect")
app.add_typer(relay.app, name="relay")
app.add_typer(lake.app, name="lake")
app.add_typer(effects.app, name="effects")
app.command("demo")(demo.run_demo)


if __name__ == "__main__":  # pragma: no cover
    app()
