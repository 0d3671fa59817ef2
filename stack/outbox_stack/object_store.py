"""An S3-compatible object store for a lake on ``s3://``: SeaweedFS in ``mini`` mode, on loopback.

One ``weed mini`` process (master, volume server, filer and S3 gateway) keeps one bucket,
``lake``, as files under its folder (``<stack>/lake-store/data``). The test suite starts one
(``tests/fix_object_store.py``); ``outbox stack up`` starts one when
``OUTBOX_STACK_OBJECT_STORE=true``, and ``outbox stack env`` then points the lake at it.

Invariants:
- Every listener is on 127.0.0.1: the S3 port (``OUTBOX_STACK_OBJECT_STORE_PORT``), the next
  four (master, volume server, filer, admin) and each of the five plus 10000 (gRPC, SeaweedFS's
  own convention). Telemetry is off: nothing leaves the host.
- The S3 gateway accepts one identity, generated on first start and kept in two files of the
  store's folder, readable by their owner only (:mod:`outbox_stack.secrets`); a request
  signed with any other key is refused. Clients get the keys through the standard AWS
  variables of their environment (:meth:`SeaweedStore.client_environment`), never on a
  command line.
- ``up`` returns once the S3 port answers and the bucket exists (asked of the filer, which
  holds buckets as folders).
"""

from __future__ import annotations

import os
import socket
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from outbox_stack.artifacts import seaweed_binary
from outbox_stack.errors import StackError
from outbox_stack.process import ServiceProcess
from outbox_stack.secrets import read_or_create_secret
from outbox_stack.settings import StackSettings

__all__ = ["BUCKET", "REGION", "ObjectStoreStatus", "SeaweedStore"]

BUCKET = "lake"
REGION = "us-east-1"
"""Any region: SeaweedFS ignores it, but S3 clients sign requests for one."""
_GRPC_OFFSET = 10000
_MAX_SOCKET_PATH = 100  # a Unix socket path must fit in 108 bytes


@dataclass(frozen=True)
class ObjectStoreStatus:
    running: bool
    pid: int | None
    endpoint: str


class SeaweedStore:
    def __init__(self, settings: StackSettings | None = None) -> None:
        self.settings = settings if settings is not None else StackSettings()
        self.process = ServiceProcess("weed", self.settings.root / "lake-store", marker="weed")
        self.port = self.settings.object_store_port
        self.endpoint = f"http://127.0.0.1:{self.port}"

    @property
    def data_dir(self) -> Path:
        return self.process.home / "data"

    @property
    def lake_root(self) -> str:
        """The lake's root in the store's bucket."""
        return f"s3://{BUCKET}/outbox"

    def credentials(self) -> tuple[str, str]:
        """The S3 access key id and secret key, generated the first time."""
        home = self.process.home
        return (
            read_or_create_secret(home / "s3-access-key"),
            read_or_create_secret(home / "s3-secret-key"),
        )

    def client_environment(self) -> dict[str, str]:
        """What an S3 client of this store needs in its environment: the standard AWS
        variables (Spark's S3A, ``deltalake`` and ``pyarrow`` read them) and the lake's
        path-style addressing."""
        access_key, secret_key = self.credentials()
        return {
            "AWS_ACCESS_KEY_ID": access_key,
            "AWS_SECRET_ACCESS_KEY": secret_key,
            "AWS_REGION": REGION,
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ALLOW_HTTP": "true",  # loopback only
            "OUTBOX_LAKE_S3_PATH_STYLE": "true",
        }

    def up(self) -> ObjectStoreStatus:
        """Start if stopped; wait until the S3 port answers and the bucket exists."""
        if not self.process.is_running():
            binary = seaweed_binary(self.settings.downloads_root)
            self._check_ports_free()
            self.process.home.mkdir(parents=True, exist_ok=True)
            access_key, secret_key = self.credentials()
            env = {name: value for name, value in os.environ.items() if not name.startswith("AWS_")}
            env |= {"AWS_ACCESS_KEY_ID": access_key, "AWS_SECRET_ACCESS_KEY": secret_key}
            self.process.start(self._command(str(binary)), env=env)
        self.wait_until_ready()
        return self.status()

    def down(self) -> None:
        self.process.stop()

    def status(self) -> ObjectStoreStatus:
        return ObjectStoreStatus(self.process.is_running(), self.process.pid(), self.endpoint)

    def _ports(self) -> dict[str, int]:
        p = self.port
        return {"s3": p, "master": p + 1, "volume": p + 2, "filer": p + 3, "admin": p + 4}

    def _check_ports_free(self) -> None:
        """SeaweedFS dies on the first port it cannot bind: say which, and the fix, first."""
        for name, http_port in self._ports().items():
            for port in (http_port, http_port + _GRPC_OFFSET):
                with socket.socket() as probe:
                    # As the server binds: a port whose old connections linger is free to it.
                    probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                    try:
                        probe.bind(("127.0.0.1", port))
                    except OSError as error:
                        raise StackError(
                            f"the object store needs port {port} ({name}"
                            f"{' gRPC' if port != http_port else ''}) on 127.0.0.1, which is "
                            f"in use ({error.strerror}): set OUTBOX_STACK_OBJECT_STORE_PORT to "
                            "a base port whose next four, and each of the five plus 10000, are "
                            "free"
                        ) from error

    def _command(self, binary: str) -> list[str]:
        command = [
            binary,
            "mini",
            f"-dir={self.data_dir}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            f"-bucket={BUCKET}",
            "-admin.ui=false",
            "-webdav=false",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            "-master.telemetry=false",
        ]
        for name, port in self._ports().items():
            command += [f"-{name}.port={port}", f"-{name}.port.grpc={port + _GRPC_OFFSET}"]
        for name in ("filer", "s3"):
            path = self.process.home / f"{name}.sock"
            if len(str(path)) < _MAX_SOCKET_PATH:  # else SeaweedFS's default, under /tmp
                command.append(f"-{name}.localSocket={path}")
        return command

    def wait_until_ready(self) -> None:
        deadline = time.monotonic() + self.settings.object_store_start_timeout_seconds
        last_error: Exception | None = None
        filer = f"http://127.0.0.1:{self.port + 3}/buckets/{BUCKET}/"
        while time.monotonic() < deadline:
            if not self.process.is_running():
                raise StackError(
                    f"the object store exited during start-up; see {self.process.log_file}:\n"
                    + "\n".join(self.process.tail(20))
                )
            try:
                _answers(self.endpoint)  # the S3 gateway (it refuses us: no signature)
                _answers(filer, expect_ok=True)  # the bucket exists
                return
            except OSError as error:
                last_error = error
                time.sleep(0.2)
        raise StackError(
            f"the object store did not serve bucket {BUCKET!r} on {self.endpoint} within "
            f"{self.settings.object_store_start_timeout_seconds:.0f} s (last error: "
            f"{last_error}); see {self.process.log_file}"
        )


def _answers(url: str, *, expect_ok: bool = False) -> None:
    """Raise OSError unless ``url`` answers HTTP (a 2xx when ``expect_ok``)."""
    request = urllib.request.Request(  # noqa: S310 - our own http://127.0.0.1 URL
        url, headers={"Accept": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=2):  # noqa: S310
            return
    except urllib.error.HTTPError as answer:
        if expect_ok:
            raise OSError(f"{url} answered HTTP {answer.code}") from answer
