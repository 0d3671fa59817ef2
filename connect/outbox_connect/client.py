"""Kafka Connect's REST API: apply a connector idempotently, read its status, restart it."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

from outbox.core.database_tls import tls_error
from outbox.core.errors import ConnectError

__all__ = ["ConnectClient", "ConnectError", "ConnectorState"]


@dataclass(frozen=True)
class ConnectorState:
    name: str
    connector: str  # RUNNING, PAUSED, FAILED, UNASSIGNED, ...
    tasks: list[tuple[int, str, str | None]]  # (task id, state, error trace or None)

    @property
    def running(self) -> bool:
        return (
            self.connector == "RUNNING"
            and bool(self.tasks)
            and all(state == "RUNNING" for _, state, _ in self.tasks)
        )

    @property
    def failed_tasks(self) -> list[int]:
        return [task for task, state, _ in self.tasks if state == "FAILED"]


class ConnectClient:
    def __init__(self, url: str, *, timeout: float = 30) -> None:
        self.url = url.rstrip("/")
        self.timeout = timeout

    def request(self, method: str, path: str, body: Any = None) -> Any:
        """One call; the decoded JSON answer (None when empty). HTTP errors raise."""
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(  # noqa: S310 - Connect's configured http(s) URL
            f"{self.url}{path}",
            data=data,
            method=method,
            headers={"Content-Type": "application/json", "Accept": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=self.timeout) as response:  # noqa: S310
            payload = response.read()
        return json.loads(payload) if payload else None

    def call(self, method: str, path: str, body: Any = None, *, retry_for: float = 60) -> Any:
        """:meth:`request`, retried while Connect is starting or rebalancing (409, 5xx,
        refused connections), up to ``retry_for`` seconds; then a readable error."""
        deadline = time.monotonic() + retry_for
        while True:
            try:
                return self.request(method, path, body)
            except urllib.error.HTTPError as error:
                detail = error.read().decode(errors="replace")
                if error.code not in (409, 500, 503) or time.monotonic() > deadline:
                    raise ConnectError(
                        f"Kafka Connect answered {error.code} to {method} {path}: "
                        f"{_message(detail)}"
                    ) from None
            except (urllib.error.URLError, OSError) as error:
                if time.monotonic() > deadline:
                    raise ConnectError(
                        f"Kafka Connect at {self.url} cannot be reached ({error}): is it "
                        "running? (`outbox stack status`, or OUTBOX_CONNECT_URL)"
                    ) from None
            time.sleep(0.5)

    def apply(self, name: str, config: dict[str, str]) -> bool:
        """Create or update connector ``name``; True when anything changed."""
        try:
            current = self.request("GET", f"/connectors/{name}/config")
        except urllib.error.HTTPError as error:
            if error.code != 404:
                raise ConnectError(f"Kafka Connect answered {error.code} for {name}") from None
            current = None
        except (urllib.error.URLError, OSError):
            current = None  # call() below retries and explains
        wanted = {**config, "name": name}
        if current == wanted:
            return False
        self.validate(name, config)
        self.call("PUT", f"/connectors/{name}/config", config)
        return True

    def validate(self, name: str, config: dict[str, str]) -> None:
        """Have Connect check ``config`` (Debezium connects to PostgreSQL to do so); a
        :class:`ConnectError` naming each setting it refuses, and for a TLS refusal which
        check failed and the fix.

        Asked before the config is stored: Kafka Connect 4.3 answers a refused config with
        an error 500 of its own (a NullPointerException) that names none of the reasons.
        """
        answer = self.call(
            "PUT",
            f"/connector-plugins/{config['connector.class']}/config/validate",
            {**config, "name": name},
        )
        problems = [
            f"{value['name']}: {error}"
            for entry in answer.get("configs", [])
            if (value := entry.get("value"))
            for error in value.get("errors", [])
        ]
        if not problems:
            return
        tls = next((found for p in problems if (found := tls_error(p)) is not None), None)
        raise ConnectError(
            f"Kafka Connect refuses connector {name}: {tls if tls else '; '.join(problems)}"
        )

    def state(self, name: str) -> ConnectorState | None:
        """The connector's and its tasks' states; None when it does not exist (yet)."""
        try:
            status = self.request("GET", f"/connectors/{name}/status")
        except urllib.error.HTTPError as error:
            if error.code == 404:
                return None
            raise ConnectError(f"Kafka Connect answered {error.code} for {name}") from None
        except (urllib.error.URLError, OSError) as error:
            raise ConnectError(
                f"Kafka Connect at {self.url} cannot be reached ({error}): is it running? "
                "(`outbox stack status`, or OUTBOX_CONNECT_URL)"
            ) from None
        return ConnectorState(
            name,
            status["connector"]["state"],
            [(task["id"], task["state"], task.get("trace")) for task in status["tasks"]],
        )

    def wait_running(self, name: str, *, timeout: float = 60) -> ConnectorState:
        deadline = time.monotonic() + timeout
        state = None
        while time.monotonic() < deadline:
            state = self.state(name)
            if state is not None and state.running:
                return state
            if state is not None and state.failed_tasks:
                trace = next(t for _, s, t in state.tasks if s == "FAILED") or ""
                tls = tls_error(trace)
                raise ConnectError(f"connector {name} failed: {tls or trace.splitlines()[0:3]}")
            time.sleep(0.25)
        raise ConnectError(f"connector {name} is not running after {timeout:.0f} s: {state}")

    def restart(self, name: str) -> None:
        """Restart the connector and all its tasks, running or not: after a broker error a
        failed task may still be reported running (its status never reached the broker).
        Debezium resumes from its stored offsets, so a restart loses and skips nothing."""
        self.call("POST", f"/connectors/{name}/restart?includeTasks=true&onlyFailed=false")

    def delete(self, name: str) -> None:
        try:
            self.request("DELETE", f"/connectors/{name}")
        except urllib.error.HTTPError as error:
            if error.code != 404:
                raise ConnectError(f"Kafka Connect answered {error.code} for {name}") from None


def _message(detail: str) -> str:
    try:
        return str(json.loads(detail).get("message", detail))[:500]
    except (json.JSONDecodeError, AttributeError):
        return detail[:500]
