"""Where the private PostgreSQL keeps its server-side files: data, socket and log.

As root, the cluster runs as the ``postgres`` system user (``initdb`` refuses root), which
must reach its files. A checkout inside a folder closed to other users (root's home is 0700
on Debian) cannot hold them, so they go to a folder of their own outside it::

    ~postgres/outbox-stack/<stack folder name>-<10 hex of sha256(stack folder path)>

(``/var/lib/postgresql/outbox-stack/…`` on Debian), mode 0700, owned by ``postgres``.
The name depends only on the stack folder's path, so every run finds the same cluster; a
cluster that already exists in one place is kept there. Secrets the client reads (the
generated passwords) always stay in the stack folder. As any other user the server runs
as that user, and everything stays in the stack folder.
"""

from __future__ import annotations

import hashlib
import os
import pwd
import re
import subprocess
from pathlib import Path

__all__ = ["RUN_AS", "outside_home", "reachable_by", "server_home", "server_user"]

RUN_AS = "postgres"
OUTSIDE_FOLDER = "outbox-stack"


def server_user() -> str | None:
    """The system user the server runs as, or None when it runs as the current user."""
    return RUN_AS if os.geteuid() == 0 else None


def outside_home(stack_root: Path) -> Path:
    """The server folder of ``stack_root`` under the ``postgres`` user's home."""
    digest = hashlib.sha256(str(stack_root).encode()).hexdigest()[:10]
    name = re.sub(r"[^A-Za-z0-9_-]", "", stack_root.name) or "stack"
    return Path(pwd.getpwnam(RUN_AS).pw_dir) / OUTSIDE_FOLDER / f"{name}-{digest}"


def reachable_by(user: str, path: Path) -> bool:
    """Whether ``user`` can traverse every folder down to ``path`` (its nearest existing one)."""
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    result = subprocess.run(
        ["runuser", "-u", user, "--", "test", "-x", str(existing)],
        capture_output=True,
        check=False,
        cwd="/",
    )
    return result.returncode == 0


def server_home(client_home: Path, stack_root: Path, override: Path | None = None) -> Path | None:
    """The folder of the server's data, socket and log for the cluster of ``stack_root``.

    None while undecided: as root before PostgreSQL (and so its user) is installed.
    """
    if override is not None:
        return override.resolve()
    user = server_user()
    if user is None:
        return client_home
    try:
        outside = outside_home(stack_root)
    except KeyError:  # no postgres user yet: PostgreSQL is not installed, nothing runs
        return None
    for candidate in (client_home, outside):
        if (candidate / "data" / "PG_VERSION").exists():
            return candidate  # an existing cluster stays where it is
    return client_home if reachable_by(user, client_home) else outside
