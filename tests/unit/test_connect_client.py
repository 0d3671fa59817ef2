"""The Connect client against a fake Kafka Connect (a local HTTP server, no service): a
configuration Connect refuses is reported with each reason before it is stored, and a TLS
refusal of PostgreSQL says which check failed."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from outbox.core.errors import ConnectError
from outbox_connect import ConnectClient

PKIX = (
    "Error while validating connector config: SSL error: PKIX path building failed: "
    "sun.security.provider.certpath.SunCertPathBuilderException: unable to find valid "
    "certification path to requested target"
)
CONFIG = {"connector.class": "io.debezium.connector.postgresql.PostgresConnector", "a": "1"}


class FakeConnect:
    """Answers as Kafka Connect 4.3 with Debezium does; records the requests it got."""

    def __init__(self) -> None:
        self.errors: dict[str, list[str]] = {}
        self.task: tuple[str, str | None] = ("RUNNING", None)
        self.requests: list[tuple[str, str]] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_args: Any) -> None:
                return

            def answer(self, status: int, body: Any) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                fake.requests.append(("GET", self.path))
                if self.path.endswith("/status"):
                    state, trace = fake.task
                    task = {"id": 0, "state": state, **({"trace": trace} if trace else {})}
                    self.answer(200, {"connector": {"state": "RUNNING"}, "tasks": [task]})
                else:
                    self.answer(404, {"message": "not found"})

            def do_PUT(self) -> None:
                self.rfile.read(int(self.headers["Content-Length"]))
                fake.requests.append(("PUT", self.path))
                if self.path.endswith("/config/validate"):
                    configs = [
                        {"definition": {"name": "unset.option"}, "value": None},
                        *(
                            {"value": {"name": name, "errors": errors}}
                            for name, errors in fake.errors.items()
                        ),
                    ]
                    count = sum(map(len, fake.errors.values()))
                    self.answer(200, {"error_count": count, "configs": configs})
                elif fake.errors:  # Connect 4.3: a NullPointerException, no reason given
                    self.answer(500, {"message": "Cannot invoke ConfigValueInfo.errors()"})
                else:
                    self.answer(201, {})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


@pytest.fixture
def connect() -> Iterator[FakeConnect]:
    fake = FakeConnect()
    yield fake
    fake.stop()


def test_a_valid_config_is_checked_then_stored(connect: FakeConnect) -> None:
    assert ConnectClient(connect.url).apply("c", CONFIG) is True
    assert [r for r in connect.requests if r[0] == "PUT"] == [
        ("PUT", f"/connector-plugins/{CONFIG['connector.class']}/config/validate"),
        ("PUT", "/connectors/c/config"),
    ]


def test_a_refused_config_names_each_reason_and_is_not_stored(connect: FakeConnect) -> None:
    connect.errors = {"slot.name": ["bad slot"], "database.dbname": ["no such database"]}
    with pytest.raises(ConnectError) as refused:
        ConnectClient(connect.url).apply("c", CONFIG)
    assert str(refused.value) == (
        "Kafka Connect refuses connector c: slot.name: bad slot; database.dbname: no such database"
    )
    assert ("PUT", "/connectors/c/config") not in connect.requests


def test_a_tls_refusal_says_which_check_failed(connect: FakeConnect) -> None:
    connect.errors = {"database.hostname": [PKIX]}
    with pytest.raises(ConnectError, match="refuses connector c: TLS with PostgreSQL failed: "):
        ConnectClient(connect.url).apply("c", CONFIG)


def test_a_task_failing_on_tls_says_which_check_failed(connect: FakeConnect) -> None:
    connect.task = ("FAILED", f"org.apache.kafka.connect.errors.ConnectException: {PKIX}\n\tat x")
    with pytest.raises(ConnectError, match="connector c failed: TLS with PostgreSQL failed: "):
        ConnectClient(connect.url).wait_running("c", timeout=10)
