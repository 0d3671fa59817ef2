"""Who may use the console, and which requests may act.

- **The token** is read from ``OUTBOX_CONSOLE_TOKEN_FILE`` once, at start: never from the
  environment or the command line, never logged, never in a URL. With a token, every request
  but the login form and the static files must carry it: ``Authorization: Bearer <token>``
  (scripts), or the cookie the login form sets (``HttpOnly``, ``SameSite=Strict``; its value
  is derived from the token, not the token). Tokens are compared in constant time (their
  SHA-256 digests, so not even their lengths tell).
- **Without a token** the console listens on loopback only (:class:`ConsoleSettings` refuses
  to start otherwise), and answers only requests whose ``Host`` is a loopback name, so that a
  web page whose name is made to point at 127.0.0.1 (DNS rebinding) reads nothing.
- **Actions** (replay, discard) exist only with ``OUTBOX_CONSOLE_ALLOW_ACTIONS``: POST forms
  carrying a CSRF token, an HMAC of the browser's session under a key drawn at start (a
  page of another site can send the form but cannot read the token). A request authorized by
  its ``Authorization`` header needs none: a browser never adds that header by itself.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from pathlib import Path

from outbox.core.errors import ConfigurationError

__all__ = ["COOKIE", "MIN_TOKEN_LENGTH", "Guard", "read_token"]

COOKIE = "outbox_console"
MIN_TOKEN_LENGTH = 16


def read_token(path: Path) -> str:
    """The token in ``path`` (its first line, stripped); a :class:`ConfigurationError`
    naming OUTBOX_CONSOLE_TOKEN_FILE when it cannot be read or is too short."""
    try:
        lines = path.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigurationError(
            f"OUTBOX_CONSOLE_TOKEN_FILE: cannot read {path} ({type(error).__name__}: "
            f"{getattr(error, 'strerror', None) or error})"
        ) from None
    token = lines[0].strip() if lines else ""
    if len(token) < MIN_TOKEN_LENGTH:
        raise ConfigurationError(
            f"OUTBOX_CONSOLE_TOKEN_FILE: the token in {path} is shorter than "
            f"{MIN_TOKEN_LENGTH} characters: write a longer one (e.g. `head -c 32 /dev/urandom "
            "| base64`)"
        )
    return token


def _digest(text: str) -> bytes:
    return hashlib.sha256(text.encode()).digest()


class Guard:
    """The console's token (None: none is required) and its CSRF key."""

    def __init__(self, token: str | None) -> None:
        self._token_digest = None if token is None else _digest(token)
        self._session = (
            None
            if token is None
            else hmac.new(token.encode(), b"outbox-console session", hashlib.sha256).hexdigest()
        )
        self._csrf_key = secrets.token_bytes(32)

    @property
    def required(self) -> bool:
        return self._token_digest is not None

    def is_token(self, given: str) -> bool:
        """Whether ``given`` is the token, compared in constant time."""
        if self._token_digest is None:
            return True
        return hmac.compare_digest(_digest(given), self._token_digest)

    def by_header(self, authorization: str | None) -> bool:
        """Whether an ``Authorization: Bearer`` header carries the token."""
        if self._token_digest is None or not authorization:
            return False
        scheme, _, given = authorization.partition(" ")
        return scheme.lower() == "bearer" and self.is_token(given.strip())

    def session_cookie(self) -> str:
        """The value of the cookie the login form sets (derived from the token)."""
        assert self._session is not None
        return self._session

    def by_cookie(self, cookie: str | None) -> bool:
        if self._session is None or not cookie:
            return False
        return hmac.compare_digest(_digest(cookie), _digest(self._session))

    def allows(self, authorization: str | None, cookie: str | None) -> bool:
        """Whether a request with these credentials may read the console."""
        return not self.required or self.by_header(authorization) or self.by_cookie(cookie)

    def csrf_token(self, cookie: str | None) -> str:
        """The CSRF token of the forms shown to the browser with this session cookie."""
        session = cookie if self.by_cookie(cookie) else ""
        return hmac.new(self._csrf_key, f"csrf {session}".encode(), hashlib.sha256).hexdigest()

    def csrf_ok(self, given: str | None, cookie: str | None) -> bool:
        if not given:
            return False
        return hmac.compare_digest(_digest(given), _digest(self.csrf_token(cookie)))
