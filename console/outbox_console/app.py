"""The console's web application (Starlette): server-rendered pages, htmx for the overview's
live refresh and the lineage's late arrival; no JavaScript of our own, no build step.

Pages never wait on a component for long: the overview shows what each panel's
:class:`~outbox_console.watch.Watch` last read; the other pages run their one query on a
thread with a deadline, and say "no answer in N s" past it. A component that fails shows its
reason in the page, never a server error.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import importlib
import secrets
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

import jinja2
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from outbox_console.dead_letters import Outcome, Store
from outbox_console.lineage import Tracer
from outbox_console.panels import READERS, Panel, Pipeline, ago, delivery_path
from outbox_console.security import COOKIE, Guard
from outbox_console.settings import is_loopback
from outbox_console.watch import Watch, reason_of

__all__ = ["Console", "create_app"]

HERE = Path(__file__).resolve().parent
LOOPBACK_NAMES = {"127.0.0.1", "localhost", "::1", "[::1]"}
ACTION_SECONDS = 60.0
"""How long an action (a replay waits for the broker's acknowledgement) may take."""
OPEN_PATHS = ("/login", "/static/")
STATE_WORDS = {
    "ok": "ok",
    "warn": "attention",
    "down": "down",
    "slow": "no answer",
    "waiting": "reading",
}

T = TypeVar("T")


@dataclass(frozen=True)
class Failure:
    reason: str


class Console:
    """What the pages read from: the pipeline's settings, the panels' watches, the dead
    letters, and the guard."""

    def __init__(
        self,
        pipeline: Pipeline,
        guard: Guard,
        *,
        store: Store | None = None,
        watches: list[Watch] | None = None,
    ) -> None:
        self.pipeline = pipeline
        self.guard = guard
        self.settings = pipeline.console
        self._engine: Any = None
        if store is None:
            from sqlalchemy import create_engine

            seconds = self.settings.answer_seconds
            self._engine = create_engine(
                pipeline.database_url,
                pool_size=2,
                pool_pre_ping=True,
                connect_args={
                    "connect_timeout": max(1, round(seconds)),
                    "application_name": "outbox-console",
                },
            )
            store = Store(pipeline, self._engine)
        self.store = store
        self.tracer = Tracer(pipeline, self._engine)
        self.watches = (
            watches
            if watches is not None
            else [
                Watch(
                    name,
                    functools.partial(read, pipeline),
                    interval_seconds=self.settings.refresh_seconds,
                    answer_seconds=self.settings.answer_seconds,
                )
                for name, read in READERS.items()
            ]
        )
        self.executor = ThreadPoolExecutor(max_workers=8, thread_name_prefix="console")
        self.outcomes: collections.OrderedDict[str, Outcome] = collections.OrderedDict()

    def start(self) -> None:
        for watch in self.watches:
            watch.start()
        # trace's modules (Delta, Arrow) take a second to import: not on the first lineage
        self.executor.submit(importlib.import_module, "outbox_reconcile.trace")

    def close(self) -> None:
        for watch in self.watches:
            watch.stop()
        self.executor.shutdown(wait=False, cancel_futures=True)
        self.tracer.close()
        if self._engine is not None:
            self._engine.dispose()

    def panels(self) -> list[Panel]:
        return [watch.panel() for watch in self.watches]

    async def within(self, seconds: float, call: Callable[[], T]) -> T | Failure:
        """``call()`` on a thread; a :class:`Failure` saying why when it raised or did not
        answer within ``seconds`` (it goes on, its answer unused)."""
        future = asyncio.get_running_loop().run_in_executor(self.executor, call)
        try:
            return await asyncio.wait_for(future, seconds)
        except TimeoutError:
            return Failure(f"no answer in {seconds:g} s")
        except Exception as error:
            return Failure(reason_of(error))

    def remember(self, outcome: Outcome) -> str:
        """Keep an action's outcome for the page the browser is sent to; its key."""
        key = secrets.token_urlsafe(12)
        self.outcomes[key] = outcome
        while len(self.outcomes) > 100:
            self.outcomes.popitem(last=False)
        return key


def create_app(console: Console) -> Starlette:
    settings = console.settings
    guard = console.guard
    environment = jinja2.Environment(
        loader=jinja2.FileSystemLoader(HERE / "templates"), autoescape=True
    )
    templates = Jinja2Templates(env=environment)
    templates.env.globals.update(ago=ago, state_words=STATE_WORDS)
    loopback_only = is_loopback(settings.host)

    def render(request: Request, name: str, status_code: int = 200, **context: Any) -> Response:
        cookie = request.cookies.get(COOKIE)
        context.update(
            allow_actions=settings.allow_actions,
            refresh_seconds=settings.refresh_seconds,
            signed_in=guard.required and guard.by_cookie(cookie),
            csrf=guard.csrf_token(cookie),
        )
        response: Response = templates.TemplateResponse(
            request, name, context, status_code=status_code
        )
        return response

    # -- the overview -------------------------------------------------------------------------

    def overview_context() -> dict[str, Any]:
        panels = console.panels()
        details = {panel.name: panel.detail for panel in panels}
        return {
            "panels": panels,
            "delivery": delivery_path(details.get("Kafka Connect"), details.get("Relay")),
            "now": datetime.now().astimezone().isoformat(timespec="seconds"),
        }

    async def overview(request: Request) -> Response:
        return render(request, "overview.html", title="Overview", **overview_context())

    async def overview_fragment(request: Request) -> Response:
        return render(request, "_panels.html", **overview_context())

    # -- an event by id -----------------------------------------------------------------------

    def event_id_of(request: Request) -> tuple[str, str | None]:
        """The id asked for, and why it is not one (None: it is a UUID)."""
        given = request.query_params.get("id", "").strip()
        if not given:
            return "", None
        try:
            return str(uuid.UUID(given)), None
        except ValueError:
            return (
                given,
                "not a UUID: give an event id as the lake or a record's 'id' header has it",
            )

    def scan_of(request: Request) -> bool:
        return request.query_params.get("scan") in ("on", "1", "true")

    async def event_page(request: Request) -> Response:
        event_id, wrong = event_id_of(request)
        return render(
            request,
            "event.html",
            title="Find an event",
            event_id=event_id,
            wrong=wrong,
            scan=scan_of(request),
        )

    async def lineage_fragment(request: Request) -> Response:
        """The lineage in two steps: the outbox and the lake at once, then (this fragment
        asks for itself again, ``kafka=1``) with Kafka searched, which may read a busy
        partition for seconds."""
        event_id, wrong = event_id_of(request)
        if wrong or not event_id:
            return render(request, "_lineage.html", failure=wrong or "no event id", lineage=None)
        scan = scan_of(request)
        search = request.query_params.get("kafka") == "1"
        found = await console.within(
            settings.trace_seconds if search else settings.answer_seconds,
            lambda: console.tracer.trace(event_id, scan_kafka=scan, search_kafka=search),
        )
        if isinstance(found, Failure):
            return render(request, "_lineage.html", failure=found.reason, lineage=None)
        return render(
            request,
            "_lineage.html",
            failure=None,
            lineage=found,
            scan=scan,
            searching=not search,
            trace_seconds=settings.trace_seconds,
        )

    # -- dead letters -------------------------------------------------------------------------

    async def dead_letters(request: Request) -> Response:
        found = await console.within(settings.answer_seconds, console.store.listing)
        outcome = console.outcomes.get(request.query_params.get("outcome", ""))
        failure = found.reason if isinstance(found, Failure) else None
        return render(
            request,
            "dead_letters.html",
            title="Dead letters",
            letters=None if isinstance(found, Failure) else found,
            failure=failure,
            outcome=outcome,
        )

    async def relay_letter(request: Request) -> Response:
        try:
            event_id = uuid.UUID(request.path_params["event_id"])
        except ValueError:
            return render(request, "not_found.html", 404, title="Not found", what="not a UUID")
        found = await console.within(
            settings.answer_seconds, lambda: console.store.relay_letter(event_id)
        )
        if found is None:
            what = f"no relay dead letter {event_id}"
            return render(request, "not_found.html", 404, title="Not found", what=what)
        return render(
            request,
            "relay_letter.html",
            title=f"Dead letter {event_id}",
            letter=None if isinstance(found, Failure) else found,
            failure=found.reason if isinstance(found, Failure) else None,
            event_id=event_id,
        )

    def place_of(values: Any) -> Any:
        from outbox.consumer_dead_letters import DeadLetterPlace

        try:
            return DeadLetterPlace(
                str(values["consumer"]),
                str(values["topic"]),
                int(values["partition"]),
                int(values["offset"]),
            )
        except (KeyError, ValueError):
            return None

    async def consumer_letter(request: Request) -> Response:
        place = place_of(request.query_params)
        if place is None:
            what = "name a dead letter by consumer, topic, partition and offset"
            return render(request, "not_found.html", 404, title="Not found", what=what)
        found = await console.within(
            settings.answer_seconds, lambda: console.store.consumer_letter(place)
        )
        if found is None:
            return render(
                request, "not_found.html", 404, title="Not found", what=f"no dead letter {place}"
            )
        return render(
            request,
            "consumer_letter.html",
            title=f"Dead letter {place}",
            letter=None if isinstance(found, Failure) else found,
            failure=found.reason if isinstance(found, Failure) else None,
            place=place,
            text=_text,
        )

    def action(
        run: Callable[[Console, Any], Outcome],
        parse: Callable[[Any], Any],
        *,
        confirm: bool = False,
    ) -> Callable[[Request], Awaitable[Response]]:
        """A POST endpoint: CSRF checked, the form parsed (``confirm``: its box ``yes``
        ticked), ``run`` on a thread, the outcome shown on the dead letters' page."""

        async def endpoint(request: Request) -> Response:
            form = await request.form()
            by_header = guard.by_header(request.headers.get("authorization"))
            csrf = form.get("csrf")
            if not by_header and not guard.csrf_ok(
                csrf if isinstance(csrf, str) else None, request.cookies.get(COOKIE)
            ):
                return Response("CSRF check failed: reload the page and try again", 403)
            target = parse(form)
            if target is None:
                return Response("the form names no dead letter", 400)
            if confirm and form.get("yes") != "on":
                outcome = Outcome(False, "not discarded: tick the box to confirm")
            else:
                done = await console.within(ACTION_SECONDS, lambda: run(console, target))
                outcome = (
                    Outcome(False, f"not done: {done.reason}")
                    if isinstance(done, Failure)
                    else done
                )
            key = console.remember(outcome)
            return RedirectResponse(f"/dead-letters?outcome={key}", status_code=303)

        return endpoint

    def relay_id(form: Any) -> uuid.UUID | None:
        try:
            return uuid.UUID(str(form.get("event_id", "")))
        except ValueError:
            return None

    # -- signing in ---------------------------------------------------------------------------

    async def login_page(request: Request) -> Response:
        return render(request, "login.html", title="Sign in", wrong=False)

    async def login(request: Request) -> Response:
        form = await request.form()
        given = form.get("token")
        if not guard.required:
            return RedirectResponse("/", status_code=303)
        if not isinstance(given, str) or not guard.is_token(given):
            await asyncio.sleep(0.5)  # a guess costs time
            return render(request, "login.html", 401, title="Sign in", wrong=True)
        response = RedirectResponse("/", status_code=303)
        response.set_cookie(
            COOKIE,
            guard.session_cookie(),
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
            path="/",
        )
        return response

    async def logout(request: Request) -> Response:
        response = RedirectResponse("/login", status_code=303)
        response.delete_cookie(COOKIE, path="/")
        return response

    # -- the guard, before every page ---------------------------------------------------------

    async def guard_requests(
        request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        host = (
            request.headers.get("host", "").rsplit(":", 1)[0] if request.headers.get("host") else ""
        )
        if loopback_only and host not in LOOPBACK_NAMES:
            return Response("this console answers on 127.0.0.1 or localhost only", 421)
        started = time.perf_counter()
        open_path = request.url.path.startswith(OPEN_PATHS)
        if not open_path and not guard.allows(
            request.headers.get("authorization"), request.cookies.get(COOKIE)
        ):
            if request.headers.get("hx-request"):
                return Response("sign in first", 401, headers={"HX-Redirect": "/login"})
            response = render(request, "login.html", 401, title="Sign in", wrong=False)
        else:
            response = await call_next(request)
        response.headers.update(
            {
                "Content-Security-Policy": (
                    "default-src 'self'; frame-ancestors 'none'; form-action 'self'; "
                    "base-uri 'none'"
                ),
                "X-Frame-Options": "DENY",
                "X-Content-Type-Options": "nosniff",
                "Referrer-Policy": "no-referrer",
                "Cache-Control": "no-store",
                # The page's time in the console (benchmarks/console_pages.py reads it).
                "Server-Timing": f"app;dur={(time.perf_counter() - started) * 1000:.1f}",
            }
        )
        return response

    routes = [
        Route("/", overview),
        Route("/fragments/overview", overview_fragment),
        Route("/events", event_page),
        Route("/fragments/lineage", lineage_fragment),
        Route("/dead-letters", dead_letters),
        Route("/dead-letters/relay/{event_id}", relay_letter),
        Route("/dead-letters/consumer", consumer_letter),
        Route("/login", login_page, methods=["GET"]),
        Route("/login", login, methods=["POST"]),
        Route("/logout", logout, methods=["POST"]),
        Mount("/static", StaticFiles(directory=str(HERE / "static")), name="static"),
    ]
    if settings.allow_actions:  # otherwise they do not exist: 404 (or 405 beside a page)
        routes += [
            Route(
                "/actions/relay/replay",
                action(lambda c, target: c.store.replay_relay(target), relay_id),
                methods=["POST"],
            ),
            Route(
                "/actions/relay/discard",
                action(lambda c, target: c.store.discard_relay(target), relay_id, confirm=True),
                methods=["POST"],
            ),
            Route(
                "/actions/consumer/replay",
                action(lambda c, target: c.store.replay_consumer(target), place_of),
                methods=["POST"],
            ),
            Route(
                "/actions/consumer/discard",
                action(lambda c, target: c.store.discard_consumer(target), place_of, confirm=True),
                methods=["POST"],
            ),
        ]

    @contextlib.asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        console.start()
        try:
            yield
        finally:
            console.close()

    return Starlette(
        routes=routes,
        middleware=[Middleware(BaseHTTPMiddleware, dispatch=guard_requests)],
        lifespan=lifespan,
    )


def _text(data: bytes | None) -> str:
    """Bytes shown as text: UTF-8, other bytes escaped (``\\xff``); ``(null)`` for none."""
    return "(null)" if data is None else data.decode("utf-8", "backslashreplace")
