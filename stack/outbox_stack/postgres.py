"""A private PostgreSQL 15 cluster on loopback, from Debian's binaries.

The generated passwords live in ``<stack dir>/postgres``; the server's own files (data,
socket, log) live there too, or, when the server's user cannot reach the stack folder, in a
folder of their own (:mod:`outbox_stack.server_home`). It listens on ``127.0.0.1:<port>`` only,
and runs with ``wal_level=logical`` and room for replication slots, so Debezium can tail it.
When the current user is root, the cluster runs as the ``postgres`` system user (``initdb``
refuses root). Nothing here touches a system cluster.

Security: no ``trust`` anywhere: every connection, over TCP and over the Unix socket, proves
the password (SCRAM); the socket folder is 0700, so only the server's user reaches it;
password files are created 0600 from their first byte (:mod:`outbox_stack.secrets`).
TCP takes TLS only (``ssl=on``, ``hostssl`` rules): the server's certificate is signed by a CA
of the stack's own (:mod:`outbox_stack.tls`), and the URLs this module gives (``url``,
``conninfo``) verify it with ``sslmode=verify-full`` and ``sslrootcert=<the CA file>``.
Clients that do not ask for TLS get it anyway (libpq's and PostgreSQL's JDBC driver's default,
``prefer``), without verification.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pwd
import re
import shlex
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal
from urllib.parse import quote

import psycopg
from psycopg import sql

from outbox_stack.artifacts import ensure_postgres_binaries
from outbox_stack.errors import StackError
from outbox_stack.secrets import read_or_create_secret, write_secret
from outbox_stack.server_home import RUN_AS, server_home
from outbox_stack.settings import StackSettings
from outbox_stack.tls import TlsFiles, ensure_certificates

__all__ = ["PostgresCluster", "PostgresStatus"]

log = logging.getLogger(__name__)

SUPERUSER = "postgres"
# What clients ask of the server's certificate: signed by the CA, and for the host they named.
SSLMODE: Literal["verify-full"] = "verify-full"
# The kernel's limit on a Unix socket's path (sun_path), less the terminating NUL.
_SOCKET_PATH_MAX = 107
# Passed at each start (so a restart applies a change). fsync stays on: benchmarks measure
# real commits. track_commit_timestamp lets tests compare positions with commit order.
SERVER_SETTINGS = {
    "listen_addresses": "127.0.0.1",
    "wal_level": "logical",
    "max_replication_slots": "20",
    "max_wal_senders": "20",
    "max_connections": "200",
    "shared_buffers": "256MB",
    "fsync": "on",
    "synchronous_commit": "on",
    "track_commit_timestamp": "on",
    "password_encryption": "scram-sha-256",
    "log_min_messages": "warning",
}


@dataclass(frozen=True)
class PostgresStatus:
    running: bool
    pid: int | None
    port: int
    data_dir: Path
    log_file: Path
    socket_dir: Path
    ca_file: Path


class PostgresCluster:
    """Create, start, probe and stop the private cluster. Every step is idempotent."""

    def __init__(self, settings: StackSettings | None = None) -> None:
        self.settings = settings if settings is not None else StackSettings()
        self.home = self.settings.root / "postgres"
        self.password_file = self.home / "superuser.password"
        self.port = self.settings.postgres_port
        self._server_home: Path | None = None

    @property
    def server_home(self) -> Path:
        """The folder of the server's data, socket and log (see :mod:`outbox_stack.server_home`)."""
        if self._server_home is None:
            found = server_home(self.home, self.settings.root, self.settings.postgres_server_dir)
            if found is None:
                return self.home  # undecided until PostgreSQL is installed
            self._server_home = found
        return self._server_home

    @property
    def data_dir(self) -> Path:
        return self.server_home / "data"

    @property
    def socket_dir(self) -> Path:
        return self.server_home / "run"

    @property
    def log_file(self) -> Path:
        return self.server_home / "postgres.log"

    @property
    def ca_file(self) -> Path:
        """The stack's CA certificate, which clients trust (``sslrootcert``)."""
        return self.home / "tls" / "ca.crt"

    @property
    def tls_files(self) -> TlsFiles:
        server = self.server_home / "tls"
        return TlsFiles(self.ca_file, server / "server.crt", server / "server.key")

    def tls_parameters(self) -> dict[str, str]:
        """libpq's parameters that verify the server: ``sslmode`` and ``sslrootcert``."""
        return {"sslmode": SSLMODE, "sslrootcert": str(self.ca_file)}

    # --- addresses -------------------------------------------------------------------------

    def url(
        self,
        database: str | None = None,
        *,
        driver: str = "postgresql+psycopg",
        role: str = SUPERUSER,
        password: str | None = None,
    ) -> str:
        """SQLAlchemy URL of ``database`` (default: the stack's) for ``role`` (default: the
        superuser, with its password), verifying the server's certificate
        (``?sslmode=verify-full&sslrootcert=<CA file>``)."""
        name = database or self.settings.postgres_database
        secret = quote(self.password() if password is None else password, safe="")
        return f"{driver}://{role}:{secret}@127.0.0.1:{self.port}/{name}?{self._query()}"

    def conninfo(self, database: str | None = None) -> str:
        """libpq connection string, for psycopg; it verifies the server's certificate."""
        return self._conninfo(database, verify=True)

    def display_url(self, database: str | None = None) -> str:
        """The URL with its password masked: safe to print and log."""
        name = database or self.settings.postgres_database
        return f"postgresql+psycopg://{SUPERUSER}:***@127.0.0.1:{self.port}/{name}?{self._query()}"

    def _query(self) -> str:
        return "&".join(
            f"{key}={quote(value, safe='/')}" for key, value in self.tls_parameters().items()
        )

    def _conninfo(self, database: str | None, *, verify: bool) -> str:
        name = database or self.settings.postgres_database
        tls = self.tls_parameters() if verify else {}
        return psycopg.conninfo.make_conninfo(
            host="127.0.0.1",
            port=self.port,
            user=SUPERUSER,
            password=self.password(),
            dbname=name,
            **tls,
        )

    def cdc_password(self) -> str:
        """The password of the local stack's CDC role, generated once (file mode 0600)."""
        return read_or_create_secret(self.home / "cdc.password")

    def relay_password(self) -> str:
        """The password of the local stack's relay role, generated once (file mode 0600)."""
        return read_or_create_secret(self.home / "relay.password")

    def password(self) -> str:
        try:
            return self.password_file.read_text().strip()
        except FileNotFoundError as error:
            raise StackError(
                f"no stack in {self.settings.root} (the private Postgres has no password "
                f"file at {self.password_file}): run `outbox stack up` first, or point "
                "OUTBOX_STACK_DIR at the stack's folder (by default `.stack` in the current "
                "folder, else the stack `outbox stack up` last started)"
            ) from error

    # --- life cycle ------------------------------------------------------------------------

    def up(self) -> PostgresStatus:
        """Install if needed, initialise if needed, start if stopped, wait until it answers.

        A server already running is restarted when its certificate was just renewed, or
        when it does not serve TLS yet (started by a version before TLS).
        """
        self.ensure_binaries()
        self.init()
        renewed = self.ensure_tls()
        if not self.is_running():
            self._start()
        elif renewed or not self._serves_tls():
            log.warning("restarting the private Postgres: it serves TLS with %s", self.ca_file)
            self.down()
            self._start()
        self.wait_until_ready()
        self.ensure_database(self.settings.postgres_database)
        return self.status()

    def down(self) -> None:
        """Stop the cluster (fast shutdown: open transactions roll back). Keeps its data."""
        if not self.is_running():
            return
        self._pg_ctl("stop", "-m", "fast", "-w", "-t", "60")

    def restart(self) -> None:
        """Stop and start again, waiting until it answers."""
        self.down()
        self._start()
        self.wait_until_ready()

    def destroy(self) -> None:
        """Stop the cluster and delete its folders (the server's, wherever it is, too)."""
        self.down()
        # Only what the server made: OUTBOX_STACK_POSTGRES_SERVER_DIR may name a shared folder.
        shutil.rmtree(self.data_dir, ignore_errors=True)
        shutil.rmtree(self.socket_dir, ignore_errors=True)
        shutil.rmtree(self.tls_files.server_key.parent, ignore_errors=True)
        self.log_file.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            self.server_home.rmdir()  # when empty
        shutil.rmtree(self.home, ignore_errors=True)

    def status(self) -> PostgresStatus:
        return PostgresStatus(
            running=self.is_running(),
            pid=self.pid(),
            port=self.port,
            data_dir=self.data_dir,
            log_file=self.log_file,
            socket_dir=self.socket_dir,
            ca_file=self.ca_file,
        )

    def is_running(self) -> bool:
        if not (self.data_dir / "PG_VERSION").exists():
            return False
        result = self._pg_ctl("status", check=False)
        return result.returncode == 0

    def pid(self) -> int | None:
        try:
            first_line = (self.data_dir / "postmaster.pid").read_text().splitlines()[0]
        except (FileNotFoundError, IndexError):
            return None
        return int(first_line) if first_line.isdigit() else None

    # --- steps -----------------------------------------------------------------------------

    def ensure_binaries(self) -> None:
        """Make sure PostgreSQL 15's binaries are there; as root, install them with apt-get."""
        ensure_postgres_binaries(self.settings.postgres_bin)

    def init(self) -> None:
        """Create the cluster once: data folder, generated superuser password, settings."""
        if (self.data_dir / "PG_VERSION").exists():
            return
        self.home.mkdir(parents=True, exist_ok=True)
        self._server_home = None  # decide again: a umask of 077 may just have closed the folder
        read_or_create_secret(self.password_file)
        server = self.server_home
        if server == self.home or os.geteuid() != 0:
            server.mkdir(mode=0o700, parents=True, exist_ok=True)
            server.chmod(0o700)
        else:  # a folder outside the stack's: made by the server's user, 0700 all the way
            for folder in (server.parent, server):
                self._run("mkdir", "-p", "-m", "0700", str(folder), check=False)
        if self.data_dir.exists():
            shutil.rmtree(self.data_dir)  # a half-made data folder from an interrupted init
        self.data_dir.mkdir(mode=0o700)
        self.socket_dir.mkdir(mode=0o700, exist_ok=True)
        self._give_to_run_as(server)
        if os.geteuid() == 0 and self._run("test", "-w", str(server), check=False).returncode:
            raise StackError(
                f"the {RUN_AS} user cannot reach {server}: a parent folder is closed to "
                "other users; unset OUTBOX_STACK_POSTGRES_SERVER_DIR (the stack then picks a "
                "folder it owns) or point it at a folder it can traverse"
            )
        # initdb reads the password from a file of the server's user, 0600, removed after.
        pwfile = server / ".initdb-pwfile"
        pwfile.unlink(missing_ok=True)
        write_secret(pwfile, self.password(), owner=self._run_as_ids())
        try:
            self._run(
                str(self.settings.postgres_bin / "initdb"),
                "-D",
                str(self.data_dir),
                "-U",
                SUPERUSER,
                "--pwfile",
                str(pwfile),
                "--auth-local=scram-sha-256",
                "--auth-host=scram-sha-256",
                "-E",
                "UTF8",
                "--no-locale",
            )
        finally:
            pwfile.unlink(missing_ok=True)

    def ensure_tls(self) -> bool:
        """Make the stack's CA and the server's certificate unless valid ones are there (see
        :mod:`outbox_stack.tls`); True when new ones were made."""
        self.home.mkdir(parents=True, exist_ok=True)
        return ensure_certificates(
            self.tls_files, label=str(self.settings.root), owner=self._run_as_ids()
        )

    def wait_until_ready(self) -> None:
        """Probe with a real connection, verifying the server's certificate, until it succeeds
        or the deadline passes."""
        self._wait(self.conninfo("postgres"))

    def _wait(self, conninfo: str) -> None:
        deadline = time.monotonic() + self.settings.postgres_start_timeout_seconds
        last_error: Exception | None = None
        while time.monotonic() < deadline:
            try:
                with psycopg.connect(conninfo, connect_timeout=2) as connection:
                    connection.execute("SELECT 1")
                return
            except psycopg.OperationalError as error:
                last_error = error
                time.sleep(0.1)
        raise StackError(
            f"the private Postgres did not answer on 127.0.0.1:{self.port} within "
            f"{self.settings.postgres_start_timeout_seconds:.0f} s (last error: {last_error}); "
            f"see {self.log_file}"
        )

    def _serves_tls(self) -> bool:
        """Whether the running server has TLS on, with the certificate of :attr:`tls_files`."""
        unverified = self._conninfo("postgres", verify=False)
        self._wait(unverified)
        with psycopg.connect(unverified, connect_timeout=5) as connection:
            row = connection.execute(
                "SELECT current_setting('ssl'), current_setting('ssl_cert_file')"
            ).fetchone()
        return row == ("on", str(self.tls_files.server_cert))

    def ensure_database(self, name: str) -> None:
        with psycopg.connect(self.conninfo("postgres"), autocommit=True) as connection:
            exists = connection.execute(
                "SELECT 1 FROM pg_database WHERE datname = %s", (name,)
            ).fetchone()
            if not exists:
                connection.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))

    def drop_database(self, name: str) -> None:
        with psycopg.connect(self.conninfo("postgres"), autocommit=True) as connection:
            connection.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )

    # --- helpers ---------------------------------------------------------------------------

    def _start(self) -> None:
        socket = self.socket_dir / f".s.PGSQL.{self.port}"
        if len(str(socket)) > _SOCKET_PATH_MAX:
            log.warning("no Unix socket: its path would be too long (%s); TCP only", socket)
        settings = {
            **SERVER_SETTINGS,
            "port": str(self.port),
            "unix_socket_directories": (
                str(self.socket_dir) if len(str(socket)) <= _SOCKET_PATH_MAX else ""
            ),
            "unix_socket_permissions": "0700",
            "ssl": "on",
            "ssl_cert_file": str(self.tls_files.server_cert),
            "ssl_key_file": str(self.tls_files.server_key),
        }
        # pg_ctl hands these to a shell: quote every value.
        options = " ".join(f"-c {name}={shlex.quote(value)}" for name, value in settings.items())
        # Clusters made by older versions: a 0755 socket folder, `trust` for the socket.
        self.socket_dir.mkdir(mode=0o700, exist_ok=True)
        self.socket_dir.chmod(0o700)
        self._give_to_run_as(self.socket_dir)
        self._harden_hba()
        self.log_file.touch()
        self._give_to_run_as(self.log_file)
        result = self._pg_ctl(
            "start",
            "-w",
            "-t",
            str(int(self.settings.postgres_start_timeout_seconds)),
            "-l",
            str(self.log_file),
            "-o",
            options,
            check=False,
        )
        if result.returncode != 0:
            tail = self.log_file.read_text()[-2000:] if self.log_file.exists() else ""
            raise StackError(
                f"the private Postgres did not start (port {self.port} taken?):\n"
                f"{result.stdout}{result.stderr}\n--- {self.log_file} ---\n{tail}"
            )

    def _harden_hba(self) -> None:
        """Rewrite pg_hba.conf in place (the file keeps its owner and mode): any ``trust``
        rule asks for the password (``scram-sha-256``: the superuser has one since initdb),
        and every TCP rule (``host``) takes TLS only (``hostssl``)."""
        hba = self.data_dir / "pg_hba.conf"
        lines = hba.read_text().splitlines(keepends=True)
        fixed = [line if line.lstrip().startswith("#") else _hardened(line) for line in lines]
        if fixed != lines:
            trusted = any(re.search(r"\btrust\s*$", line) for line in lines if line not in fixed)
            log.log(
                logging.WARNING if trusted else logging.INFO,
                "pg_hba.conf of %s rewritten: no `trust`, TCP over TLS only (`hostssl`)",
                self.data_dir,
            )
            with hba.open("r+") as handle:
                handle.write("".join(fixed))
                handle.truncate()

    def _pg_ctl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return self._run(
            str(self.settings.postgres_bin / "pg_ctl"),
            "-D",
            str(self.data_dir),
            *args,
            check=check,
        )

    def _run(self, *command: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        full = ["runuser", "-u", RUN_AS, "--", *command] if os.geteuid() == 0 else list(command)
        # cwd "/": the server's user may not reach the caller's folder.
        result = subprocess.run(full, capture_output=True, text=True, check=False, cwd="/")
        if check and result.returncode != 0:
            raise StackError(f"{command[0]} failed ({result.returncode}):\n{result.stderr[-2000:]}")
        return result

    def _run_as_ids(self) -> tuple[int, int] | None:
        if os.geteuid() != 0:
            return None
        entry = pwd.getpwnam(RUN_AS)
        return entry.pw_uid, entry.pw_gid

    def _give_to_run_as(self, path: Path) -> None:
        if os.geteuid() != 0:
            return
        shutil.chown(path, RUN_AS, RUN_AS)
        if path.is_dir():
            for child in path.rglob("*"):
                shutil.chown(child, RUN_AS, RUN_AS)


def _hardened(rule: str) -> str:
    """One pg_hba.conf rule with the password asked for and TCP over TLS only."""
    rule = re.sub(r"\btrust(\s*)$", r"scram-sha-256\1", rule)
    return re.sub(r"^(\s*)host(\s)", r"\1hostssl\2", rule)
