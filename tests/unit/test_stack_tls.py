"""The local stack's certificates (``openssl``, no service): a CA whose key never touches the
disk, a server certificate for localhost and 127.0.0.1 with a 0600 key, kept while valid and
replaced when it would not verify, would expire within 30 days, or does not match its key."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from outbox_stack import StackError, tls
from outbox_stack.tls import TlsFiles, certificates_are_valid, ensure_certificates


def files_in(folder: Path) -> TlsFiles:
    return TlsFiles(folder / "client" / "ca.crt", folder / "server" / "server.crt",
                    folder / "server" / "server.key")  # fmt: skip


def x509(path: Path, *options: str) -> str:
    return subprocess.run(
        ["openssl", "x509", "-in", str(path), "-noout", *options],
        capture_output=True,
        text=True,
        check=True,
    ).stdout


def test_a_ca_and_a_server_certificate_for_the_stacks_names(tmp_path: Path) -> None:
    files = files_in(tmp_path)
    assert ensure_certificates(files, label="/some/stack") is True
    names = x509(files.server_cert, "-ext", "subjectAltName")
    assert "DNS:localhost" in names and "IP Address:127.0.0.1" in names
    assert "outbox-stack local CA" in x509(files.server_cert, "-issuer")
    assert "CA:TRUE" in x509(files.ca_cert, "-ext", "basicConstraints")
    assert files.server_key.stat().st_mode & 0o777 == 0o600
    assert files.server_key.parent.stat().st_mode & 0o777 == 0o700
    keys = [p for p in tmp_path.rglob("*") if p.is_file() and "PRIVATE KEY" in p.read_text()]
    assert keys == [files.server_key], "the CA's key never touches the disk"
    assert certificates_are_valid(files)


def test_valid_certificates_are_kept(tmp_path: Path) -> None:
    files = files_in(tmp_path)
    ensure_certificates(files, label="x")
    before = [path.read_bytes() for path in (files.ca_cert, files.server_cert, files.server_key)]
    assert ensure_certificates(files, label="x") is False
    assert [path.read_bytes() for path in (files.ca_cert, files.server_cert, files.server_key)] == (
        before
    )


def test_a_key_made_readable_by_others_is_closed_again(tmp_path: Path) -> None:
    files = files_in(tmp_path)
    ensure_certificates(files, label="x")
    files.server_key.chmod(0o644)
    assert ensure_certificates(files, label="x") is False
    assert files.server_key.stat().st_mode & 0o777 == 0o600


def test_a_certificate_another_ca_signed_is_replaced(tmp_path: Path) -> None:
    files, other = files_in(tmp_path / "ours"), files_in(tmp_path / "theirs")
    ensure_certificates(files, label="ours")
    ensure_certificates(other, label="theirs")
    shutil.copy(other.ca_cert, files.ca_cert)
    assert not certificates_are_valid(files)
    assert ensure_certificates(files, label="ours") is True
    assert certificates_are_valid(files)
    assert files.ca_cert.read_bytes() != other.ca_cert.read_bytes()


def test_a_key_that_is_not_the_certificates_is_replaced(tmp_path: Path) -> None:
    files, other = files_in(tmp_path / "ours"), files_in(tmp_path / "theirs")
    ensure_certificates(files, label="ours")
    ensure_certificates(other, label="theirs")
    os.replace(other.server_key, files.server_key)
    assert not certificates_are_valid(files)
    assert ensure_certificates(files, label="ours") is True and certificates_are_valid(files)


def test_a_certificate_that_expires_within_30_days_is_replaced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = files_in(tmp_path)
    ensure_certificates(files, label="x")
    later = time.time() + (tls.VALID_DAYS - tls.RENEW_DAYS + 1) * 86_400
    monkeypatch.setattr(tls, "time", SimpleNamespace(time=lambda: later))
    assert not certificates_are_valid(files)
    monkeypatch.undo()
    assert certificates_are_valid(files)


def test_without_openssl_the_error_says_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tls.shutil, "which", lambda _name: None)
    with pytest.raises(StackError, match="apt-get install -y openssl"):
        ensure_certificates(files_in(tmp_path), label="x")
