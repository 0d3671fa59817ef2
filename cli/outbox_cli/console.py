"""``outbox console``: the operators' web console (the ``console`` extra)."""

from __future__ import annotations

import typer

from outbox_cli._common import kafka_settings, load

__all__ = ["run_console"]


def run_console() -> None:
    """Serve the web console until Ctrl-C or SIGTERM: the pipeline at a glance, refreshed
    live; dead letters; an event's lineage by id.

    Settings: OUTBOX_CONSOLE_* (host, default 127.0.0.1; port, default 58088; the token's
    file, required off loopback; whether actions are allowed, default no; the relays' and
    the lake job's metrics endpoints; reconcile's metrics file), and the components' own:
    OUTBOX_DATABASE_URL, OUTBOX_KAFKA_*, OUTBOX_CONNECT_*, OUTBOX_LAKE_*. The token is read
    from its file, never from the command line. See docs/operations.md, "The console".
    """
    import uvicorn

    from outbox.settings import DatabaseSettings, OutboxSettings
    from outbox_connect.settings import ConnectorSettings
    from outbox_console import Console, ConsoleSettings, Guard, Pipeline, create_app, read_token
    from outbox_lake.settings import LakeSettings

    settings = load(ConsoleSettings)
    token = read_token(settings.token_file) if settings.token_file is not None else None
    pipeline = Pipeline(
        console=settings,
        database_url=load(DatabaseSettings).database_url.get_secret_value(),
        outbox=load(OutboxSettings),
        connector=load(ConnectorSettings),
        kafka=kafka_settings(),
        lake=load(LakeSettings),
    )
    app = create_app(Console(pipeline, Guard(token)))
    where = "actions allowed" if settings.allow_actions else "read-only"
    guard = "token required" if token is not None else "no token: loopback only"
    typer.echo(
        f"outbox console on http://{settings.host}:{settings.port}/ ({where}; {guard})",
        err=True,
    )
    # No access log: the overview refreshes every few seconds, and a request's line would
    # say nothing an operator needs (no credential is ever in a URL either way).
    uvicorn.run(
        app,
        host=settings.host,
        port=settings.port,
        log_level="warning",
        access_log=False,
        server_header=False,
    )
