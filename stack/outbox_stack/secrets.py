"""Generated secrets of the local stack: files readable by their owner only, from the first byte.

A secret file is created with ``os.open(O_CREAT | O_EXCL, 0o600)`` under a temporary name
and written through that descriptor: it never exists, not even empty, with a wider mode (no
write-then-chmod window), whatever the umask. It then gets its final name with ``link``,
which fails when the name exists: so a secret is never overwritten, never seen half-written,
and of two racing ``up`` commands the loser reads the winner's secret.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path

__all__ = ["read_or_create_secret", "write_secret"]

SECRET_MODE = 0o600


def write_secret(path: Path, text: str, *, owner: tuple[int, int] | None = None) -> None:
    """Create ``path`` (mode 0600) holding ``text``; ``FileExistsError`` if it exists.

    ``owner`` (uid, gid) hands the file to another user (root does, for the server's user)
    before a byte of the secret is written.
    """
    partial = path.with_name(f".{path.name}.{secrets.token_hex(8)}.partial")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
    descriptor = os.open(partial, flags, SECRET_MODE)
    try:
        try:
            os.fchmod(descriptor, SECRET_MODE)  # a umask can only narrow the mode: make it exact
            if owner is not None:
                os.fchown(descriptor, *owner)
            os.write(descriptor, text.encode())
            os.fsync(descriptor)
        finally:
            os.close(descriptor)
        os.link(partial, path)  # FileExistsError when the secret exists: never overwritten
    finally:
        partial.unlink(missing_ok=True)


def read_or_create_secret(path: Path) -> str:
    """The secret stored at ``path``, generating it (URL-safe, 24 bytes) the first time."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        write_secret(path, secrets.token_urlsafe(24) + "\n")
    return path.read_text().strip()
