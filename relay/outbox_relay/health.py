"""``/healthz``, ``/readyz`` and ``/metrics`` over HTTP, on a daemon thread (stdlib WSGI).

- ``/healthz``: 200 while the relay's loop is alive (it made progress or waited on purpose
  recently), else 503: a probe should restart the process.
- ``/readyz``: 200 while the relay has a database session and (as leader) a producer, or is
  a healthy standby; else 503. The body says what the relay is doing (``standby: another
  replica leads``, ``leader: standing by, CDC delivers``, ``leader: publishing, CDC does
  not deliver (took over)``, ``retrying after a broker error`` ...).
- ``/metrics``: Prometheus text format.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import make_wsgi_app

from outbox_relay.metrics import RelayMetrics

__all__ = ["HealthServer", "Liveness"]


class Liveness:
    """What the probes answer from, updated by the relay's loop."""

    def __init__(self, stale_after_seconds: float) -> None:
        self.stale_after_seconds = stale_after_seconds
        self._beat = time.monotonic()
        self.ready = False
        self.state = "starting"
        """What the relay is doing, in words (the body of ``/readyz``)."""

    def beat(self) -> None:
        self._beat = time.monotonic()

    @property
    def alive(self) -> bool:
        return time.monotonic() - self._beat < self.stale_after_seconds


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """Probes every few seconds would flood the log: say nothing."""


StartResponse = Callable[..., Any]


class HealthServer:
    def __init__(self, host: str, port: int, liveness: Liveness, metrics: RelayMetrics) -> None:
        self._liveness = liveness
        self._metrics_app = make_wsgi_app(metrics.registry)
        self._server: WSGIServer = make_server(host, port, self._app, handler_class=_QuietHandler)
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="relay-http", daemon=True
        )

    @property
    def port(self) -> int:
        return int(self._server.server_port)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _app(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path == "/metrics":
            return self._metrics_app(environ, start_response)  # type: ignore[no-any-return]
        if path == "/healthz":
            ok = self._liveness.alive
            body = "ok" if ok else "not ok: the relay's loop made no progress lately"
        elif path == "/readyz":
            ok = self._liveness.alive and self._liveness.ready
            body = f"{'ok' if ok else 'not ok'}: {self._liveness.state}"
        else:
            start_response("404 Not Found", [("Content-Type", "text/plain")])
            return [b"not found: try /healthz, /readyz or /metrics\n"]
        status = "200 OK" if ok else "503 Service Unavailable"
        start_response(status, [("Content-Type", "text/plain; charset=utf-8")])
        return [f"{body}\n".encode()]
