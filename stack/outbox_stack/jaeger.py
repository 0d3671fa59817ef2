"""Jaeger (all-in-one, in-memory), an opt-in tracing backend for the local stack and tests.

Built once from the Go module proxy (``github.com/jaegertracing/jaeger`` at
:data:`JAEGER_VERSION`, its ``cmd/jaeger``) into the downloads folder, like the jars: the Go
toolchain (1.24 or later) must be installed. Jaeger's module pins some of its dependencies
with ``replace`` directives, which ``go install module@version`` refuses; so its source is
taken from the module cache and built as the main module, with ``-mod=readonly``: the
build uses exactly the versions and checksums of the module's own ``go.mod`` and ``go.sum``
(complete for ``cmd/jaeger``: ``go list -mod=readonly -deps ./cmd/jaeger`` loads it with
the proxy off), and fails rather than resolve a missing one from the proxy, as
``-mod=mod`` would.

It runs with a configuration of ours: OTLP over HTTP (where the SDK's exporter sends spans),
the query service (the UI and its HTTP API, where tests read traces back) and its health
check, every listener on loopback, spans in memory (gone when it stops), none of Jaeger's
other receivers, extensions or its own metrics endpoint.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from outbox_stack.errors import StackError
from outbox_stack.process import ServiceProcess

__all__ = ["JAEGER_VERSION", "JaegerPorts", "JaegerService", "jaeger_binary"]

JAEGER_VERSION = "v1.76.0"
_MODULE = "github.com/jaegertracing/jaeger"
_BUILD_TIMEOUT_SECONDS = 1800.0


def jaeger_binary(downloads: Path) -> Path:
    """The ``jaeger`` program, built into ``downloads/go/bin`` the first time."""
    root = (downloads / "go").resolve()
    binary = root / "bin" / f"jaeger-{JAEGER_VERSION}"
    if binary.is_file():
        return binary
    go = shutil.which("go")
    if go is None:
        raise StackError(
            "Jaeger is built from source with Go (1.24 or later), which is not on PATH: "
            "install Go (https://go.dev/dl/) or point your services at a tracing backend of "
            "your own (OTEL_EXPORTER_OTLP_ENDPOINT)"
        )
    env = {
        **os.environ,
        "GOPATH": str(root),
        "GOMODCACHE": str(root / "mod"),
        "GOTOOLCHAIN": "local",
        "GOFLAGS": "-mod=readonly",  # Jaeger's go.sum, nothing else (see the module)
    }
    found = _go([go, "mod", "download", "-json", f"{_MODULE}@{JAEGER_VERSION}"], env=env, cwd=root)
    source = root / f"src-jaeger-{JAEGER_VERSION}"
    if not source.is_dir():
        copying = source.with_name(f".{source.name}.partial")
        shutil.rmtree(copying, ignore_errors=True)
        shutil.copytree(json.loads(found)["Dir"], copying)
        for path in [copying, *copying.rglob("*")]:
            path.chmod(path.stat().st_mode | 0o200)  # the module cache's copies are read-only
        copying.rename(source)  # as the jars: only a complete copy ever has the final name
    partial = binary.with_suffix(".partial")
    _go([go, "build", "-o", str(partial), "./cmd/jaeger"], env=env, cwd=source)
    partial.replace(binary)
    return binary


def _go(command: list[str], *, env: dict[str, str], cwd: Path) -> str:
    cwd.mkdir(parents=True, exist_ok=True)
    try:
        done = subprocess.run(
            command,
            env=env,
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=_BUILD_TIMEOUT_SECONDS,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise StackError(
            f"building Jaeger took over {_BUILD_TIMEOUT_SECONDS:.0f} s: {' '.join(command[1:3])}"
        ) from None
    if done.returncode != 0:
        raise StackError(
            f"building Jaeger failed ({' '.join(command[1:3])}): {done.stderr.strip()[-1500:]}"
        )
    return done.stdout


@dataclass(frozen=True)
class JaegerPorts:
    otlp_http: int
    query_http: int
    query_grpc: int
    health: int

    @classmethod
    def from_ui_port(cls, port: int) -> JaegerPorts:
        """The UI's port, and the next three for the others (the stack's layout)."""
        return cls(otlp_http=port + 1, query_http=port, query_grpc=port + 2, health=port + 3)


def _config(ports: JaegerPorts) -> dict[str, Any]:
    def on(port: int) -> dict[str, str]:
        return {"endpoint": f"127.0.0.1:{port}"}

    return {
        "service": {
            "extensions": ["jaeger_storage", "jaeger_query", "healthcheckv2"],
            "pipelines": {
                "traces": {
                    "receivers": ["otlp"],
                    "processors": ["batch"],
                    "exporters": ["jaeger_storage_exporter"],
                }
            },
            "telemetry": {
                "resource": {"service.name": "jaeger"},
                "metrics": {"level": "none"},
                "logs": {"level": "info"},
            },
        },
        "extensions": {
            "jaeger_query": {
                "storage": {"traces": "memstore"},
                "http": on(ports.query_http),
                "grpc": on(ports.query_grpc),
            },
            "jaeger_storage": {"backends": {"memstore": {"memory": {"max_traces": 100000}}}},
            "healthcheckv2": {"use_v2": True, "http": on(ports.health)},
        },
        "receivers": {"otlp": {"protocols": {"http": on(ports.otlp_http)}}},
        "processors": {"batch": {"timeout": "200ms"}},
        "exporters": {"jaeger_storage_exporter": {"trace_storage": "memstore"}},
    }


class JaegerService:
    """Jaeger in a process of its own under ``home`` (its log and configuration there)."""

    def __init__(self, binary: Path, home: Path, ports: JaegerPorts) -> None:
        self.binary = binary
        self.ports = ports
        self.process = ServiceProcess("jaeger", home, marker=binary.name)

    @property
    def otlp_endpoint(self) -> str:
        """Where an OTLP/HTTP exporter sends traces (``OTEL_EXPORTER_OTLP_ENDPOINT``)."""
        return f"http://127.0.0.1:{self.ports.otlp_http}"

    @property
    def query_url(self) -> str:
        """Jaeger's UI, and its HTTP API under ``/api``."""
        return f"http://127.0.0.1:{self.ports.query_http}"

    def up(self, *, timeout: float = 60.0) -> None:
        """Start it (unless it runs) and wait until its query service answers."""
        if not self.process.is_running():
            config = self.process.home / "jaeger.json"  # YAML's superset: JSON is read as is
            self.process.home.mkdir(parents=True, exist_ok=True)
            config.write_text(json.dumps(_config(self.ports), indent=2))
            self.process.start([str(self.binary), "--config", f"file:{config}"])
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.process.is_running():
                tail = "\n".join(self.process.tail(15))
                raise StackError(f"Jaeger exited; see {self.process.log_file}:\n{tail}")
            try:
                self.get("/api/services")
                return
            except (OSError, urllib.error.URLError):
                time.sleep(0.2)
        raise StackError(
            f"Jaeger did not answer on {self.query_url} within {timeout:.0f} s; "
            f"see {self.process.log_file}"
        )

    def down(self) -> None:
        self.process.stop(timeout=15)

    def get(self, path: str) -> Any:
        """A GET of Jaeger's query API (``/api/...``), its JSON answer."""
        with urllib.request.urlopen(self.query_url + path, timeout=5) as answer:  # noqa: S310 - loopback http only
            return json.loads(answer.read())

    def trace(self, trace_id: str) -> list[dict[str, Any]]:
        """The spans Jaeger holds of ``trace_id`` (32 hex digits), or [] when none."""
        try:
            found = self.get(f"/api/traces/{trace_id}")
        except urllib.error.HTTPError as error:
            if error.code == 404:
                return []
            raise
        traces = found.get("data") or []
        return list(traces[0]["spans"]) if traces else []
