"""PostgreSQL's TLS on the local stack: a certificate authority of the stack's own, and the
server certificate it signs, made with the ``openssl`` command.

- ``ca_cert`` (``<stack dir>/postgres/tls/ca.crt``): what clients trust (``sslrootcert``).
  It holds no secret.
- ``server_cert`` and ``server_key`` (``<server folder>/tls/``, next to the server's data:
  :mod:`outbox_stack.server_home`): the server's certificate, for ``localhost`` and
  ``127.0.0.1`` (its subject alternative names), and its key, mode 0600 from its first byte
  and owned by the server's user (``postgres`` when we run as root), as PostgreSQL demands.

The CA's private key only ever lives in memory: it reaches ``openssl`` through a pipe to sign
the server certificate and is then dropped, so nobody can later mint a certificate the
stack's clients would trust. A server certificate that does not verify against the CA file,
lacks one of the names, does not match its key or expires within :data:`RENEW_DAYS` is
replaced, together with a new CA (clients read the CA file at each connection).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from outbox_stack.errors import StackError
from outbox_stack.secrets import write_secret

__all__ = [
    "RENEW_DAYS",
    "SERVER_ADDRESS",
    "SERVER_NAME",
    "TlsFiles",
    "certificates_are_valid",
    "ensure_certificates",
]

SERVER_NAME = "localhost"
SERVER_ADDRESS = "127.0.0.1"
VALID_DAYS = 825
RENEW_DAYS = 30
_OPENSSL_TIMEOUT_SECONDS = 60.0
_KEY_ALGORITHM = ("-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256")


@dataclass(frozen=True)
class TlsFiles:
    """Where one cluster's CA certificate, server certificate and server key live."""

    ca_cert: Path
    server_cert: Path
    server_key: Path


def certificates_are_valid(files: TlsFiles) -> bool:
    """Whether the server certificate verifies against the CA file for the stack's name and
    address, still will in :data:`RENEW_DAYS` days, and belongs to the key next to it."""
    if not all(path.is_file() for path in (files.ca_cert, files.server_cert, files.server_key)):
        return False
    verified = _openssl(
        "verify",
        "-CAfile",
        str(files.ca_cert),
        "-verify_hostname",  # both checked: the certificate must hold the name and the address
        SERVER_NAME,
        "-verify_ip",
        SERVER_ADDRESS,
        "-attime",
        str(int(time.time()) + RENEW_DAYS * 86_400),
        str(files.server_cert),
        check=False,
    )
    if verified.returncode != 0:
        return False
    certified = _openssl("x509", "-in", str(files.server_cert), "-noout", "-pubkey", check=False)
    held = _openssl("pkey", "-in", str(files.server_key), "-pubout", check=False)
    return certified.returncode == 0 and held.returncode == 0 and certified.stdout == held.stdout


def ensure_certificates(
    files: TlsFiles, *, label: str, owner: tuple[int, int] | None = None
) -> bool:
    """Make the CA and the server certificate unless valid ones are there; True when made.

    ``label`` names the CA (its subject carries a digest of it: one CA per stack folder);
    ``owner`` (uid, gid) is the server's user, who gets the server's files (as root).
    Whatever happens, the key ends up 0600 and the server's.
    """
    renewed = False
    if not certificates_are_valid(files):
        _make(files, label=label, owner=owner)
        renewed = True
    os.chmod(files.server_key, 0o600)  # PostgreSQL refuses a key others may read
    if owner is not None:
        for path in (files.server_key, files.server_cert, files.server_key.parent):
            os.chown(path, *owner)
    return renewed


def _make(files: TlsFiles, *, label: str, owner: tuple[int, int] | None) -> None:
    digest = hashlib.sha256(label.encode()).hexdigest()[:10]
    ca_key = _openssl("genpkey", *_KEY_ALGORITHM).stdout  # in memory only, never on disk
    ca_cert = _openssl(
        "req",
        "-x509",
        "-new",
        "-key",
        "/dev/stdin",
        "-subj",
        f"/O=outbox-stack/CN=outbox-stack local CA {digest}",
        "-days",
        str(VALID_DAYS + 1),
        "-addext",
        "basicConstraints=critical,CA:TRUE,pathlen:0",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign",
        stdin=ca_key,
    ).stdout
    server_key = _openssl("genpkey", *_KEY_ALGORITHM).stdout
    for folder in {files.ca_cert.parent, files.server_key.parent}:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    _replace_secret(files.server_key, server_key, owner=owner)
    _replace(files.ca_cert, ca_cert)
    server_cert = _openssl(
        "req",
        "-x509",
        "-new",
        "-key",
        str(files.server_key),
        "-CA",
        str(files.ca_cert),
        "-CAkey",
        "/dev/stdin",
        "-subj",
        f"/O=outbox-stack/CN={SERVER_NAME}",
        "-days",
        str(VALID_DAYS),
        "-addext",
        f"subjectAltName=DNS:{SERVER_NAME},IP:{SERVER_ADDRESS}",
        "-addext",
        "basicConstraints=critical,CA:FALSE",
        "-addext",
        "keyUsage=critical,digitalSignature",
        "-addext",
        "extendedKeyUsage=serverAuth",
        stdin=ca_key,
    ).stdout
    _replace(files.server_cert, server_cert)
    if not certificates_are_valid(files):
        raise StackError(f"the certificates made in {files.server_cert.parent} do not verify")


def _replace(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` (mode 0644) under a temporary name, then rename it over."""
    partial = path.with_name(f".{path.name}.{secrets.token_hex(8)}.partial")
    try:
        partial.write_text(text)
        partial.chmod(0o644)
        partial.replace(path)
    finally:
        partial.unlink(missing_ok=True)


def _replace_secret(path: Path, text: str, *, owner: tuple[int, int] | None) -> None:
    """:func:`write_secret` (0600 from the first byte) under another name, renamed over."""
    fresh = path.with_name(f".{path.name}.{secrets.token_hex(8)}.new")
    try:
        write_secret(fresh, text, owner=owner)
        fresh.replace(path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            fresh.unlink()


def _openssl(
    *args: str, stdin: str | None = None, check: bool = True
) -> subprocess.CompletedProcess[str]:
    if shutil.which("openssl") is None:
        raise StackError(
            "the openssl command is needed for the private Postgres's certificates: "
            "install it (apt-get install -y openssl)"
        )
    result = subprocess.run(
        ["openssl", *args],
        input=stdin,
        capture_output=True,
        text=True,
        check=False,
        cwd="/",
        timeout=_OPENSSL_TIMEOUT_SECONDS,
    )
    if check and result.returncode != 0:
        raise StackError(f"openssl {args[0]} failed ({result.returncode}): {result.stderr[-1000:]}")
    return result
