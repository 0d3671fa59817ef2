"""A stand-in for a payment provider you do not control: a small HTTP service on 127.0.0.1.

It does **not** deduplicate: every ``POST /charges`` is a new charge, so a consumer that calls
twice charges twice. It counts requests per ``Idempotency-Key`` header, so tests can check that
each effect reached it at most once. ``GET /charges?idempotency_key=K`` answers whether a
charge with that key exists (200 with its id, or 404): the question a lookup asks.

``record_delay`` (``--record-delay``) makes it slow: a charge is recorded (counted, and found
by ``GET``) only that many seconds after its request arrived, and answered then. A client that
gives up sooner sees a timeout, and a lookup in between sees "not found": the request still
lands, as it does at a real provider whose processing outlives your client's timeout.

    python -m outbox_examples.payment_provider --port 8099      # Ctrl-C to stop
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

__all__ = ["PaymentProvider"]


class PaymentProvider:
    """The service, run in a thread of the caller's process until :meth:`stop`."""

    def __init__(self, port: int = 0, *, record_delay: float = 0.0) -> None:
        if not 0 <= record_delay <= 600:
            raise ValueError(f"record_delay={record_delay} must be between 0 and 600 seconds")
        self.record_delay = record_delay
        self._lock = threading.Condition()
        self._in_flight = 0  # POST /charges received and not recorded yet
        self.requests: Counter[str] = Counter()  # POST /charges per idempotency key
        self._charges: dict[str, str] = {}  # key -> charge id (the first one made with it)
        self._server = ThreadingHTTPServer(("127.0.0.1", port), self._handler_class())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> PaymentProvider:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)

    def charge(self, key: str, body: Any) -> str:
        with self._lock:
            self.requests[key] += 1
            charge_id = f"ch_{sum(self.requests.values())}"
            self._charges.setdefault(key, charge_id)
            return charge_id

    def wait_idle(self, timeout: float) -> bool:
        """Wait until every charge request received so far is recorded; False at the timeout."""
        with self._lock:
            return self._lock.wait_for(lambda: self._in_flight == 0, timeout=timeout)

    def _slow_charge(self, key: str, body: Any) -> str:
        """Record the charge after ``record_delay`` (whether or not the client still waits)."""
        with self._lock:
            self._in_flight += 1
        try:
            if self.record_delay:
                time.sleep(self.record_delay)  # the provider's own slowness, not a test's wait
            return self.charge(key, body)
        finally:
            with self._lock:
                self._in_flight -= 1
                self._lock.notify_all()

    def find(self, key: str) -> str | None:
        with self._lock:
            return self._charges.get(key)

    def counts(self) -> dict[str, int]:
        with self._lock:
            return dict(self.requests)

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        provider = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                key = self.headers.get("Idempotency-Key")
                length = int(self.headers.get("Content-Length") or 0)
                try:
                    body = json.loads(self.rfile.read(length) or b"null")
                except json.JSONDecodeError:
                    self._answer(400, {"error": "the body is not JSON"})
                    return
                if urlsplit(self.path).path != "/charges" or not key:
                    self._answer(400, {"error": "POST /charges with an Idempotency-Key header"})
                    return
                self._answer(201, {"id": provider._slow_charge(key, body)})

            def do_GET(self) -> None:
                url = urlsplit(self.path)
                if url.path == "/counts":
                    self._answer(200, provider.counts())
                    return
                key = parse_qs(url.query).get("idempotency_key", [""])[0]
                found = provider.find(key) if url.path == "/charges" and key else None
                if found is None:
                    self._answer(404, {"error": "no charge with this idempotency key"})
                else:
                    self._answer(200, {"id": found})

            def _answer(self, status: int, body: object) -> None:
                data = json.dumps(body).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    return  # the client gave up waiting; what was done is done

            def log_message(self, format: str, *args: Any) -> None:
                return  # quiet: the tests count requests instead

        return Handler


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8099)
    parser.add_argument(
        "--record-delay", type=float, default=0.0, help="seconds before a charge is recorded"
    )
    arguments = parser.parse_args()
    provider = PaymentProvider(arguments.port, record_delay=arguments.record_delay).start()
    print(f"payment provider on {provider.url} (Ctrl-C to stop)")
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        provider.stop()


if __name__ == "__main__":
    main()
