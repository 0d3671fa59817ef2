"""Secret files of the local stack, and the shell lines of `outbox stack env`: no I/O but files."""

from __future__ import annotations

import os
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from outbox_stack.broker import same_servers
from outbox_stack.local import shell_exports
from outbox_stack.secrets import read_or_create_secret, write_secret


class WriteSpy:
    """Records, for every os.write, the file written (inode) and its mode and size then."""

    def __init__(self) -> None:
        self.writes: list[tuple[int, int, int]] = []

    def __call__(self, descriptor: int, data: bytes) -> int:
        status = os.fstat(descriptor)
        self.writes.append((status.st_ino, status.st_mode & 0o777, status.st_size))
        return SPIED_WRITE(descriptor, data)


SPIED_WRITE = os.write


@pytest.fixture
def open_umask() -> Iterator[None]:
    """umask 0: a file created with the default mode would be world-readable (0666)."""
    previous = os.umask(0)
    yield
    os.umask(previous)


@pytest.fixture
def write_spy(monkeypatch: pytest.MonkeyPatch) -> WriteSpy:
    spy = WriteSpy()
    monkeypatch.setattr(os, "write", spy)
    return spy


def assert_private_from_the_first_byte(spy: WriteSpy, path: Path) -> None:
    inode = path.stat().st_ino
    first = [(mode, size) for written, mode, size in spy.writes if written == inode]
    assert first, f"{path} was not written through a descriptor of its own (write then chmod?)"
    assert first[0] == (0o600, 0), f"{path}: mode {oct(first[0][0])} at its first byte"
    assert path.stat().st_mode & 0o777 == 0o600


def test_a_secret_is_0600_from_its_first_byte_whatever_the_umask(
    tmp_path: Path, open_umask: None, write_spy: WriteSpy
) -> None:
    path = tmp_path / "a.password"
    value = read_or_create_secret(path)
    assert len(value) >= 32 and path.read_text() == value + "\n"
    assert_private_from_the_first_byte(write_spy, path)


def test_a_secret_is_never_overwritten(tmp_path: Path) -> None:
    path = tmp_path / "a.password"
    first = read_or_create_secret(path)
    assert read_or_create_secret(path) == first
    with pytest.raises(FileExistsError):
        write_secret(path, "other")
    assert path.read_text().strip() == first


def test_racing_creators_agree_on_one_secret(tmp_path: Path) -> None:
    path = tmp_path / "raced.password"
    seen: list[str] = []
    start = threading.Barrier(8)

    def create() -> None:
        start.wait(timeout=10)
        seen.append(read_or_create_secret(path))

    threads = [threading.Thread(target=create) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)
    assert len(seen) == 8 and len(set(seen)) == 1


def test_a_symlink_in_place_of_a_secret_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    (tmp_path / "a.password").symlink_to(target)
    with pytest.raises(FileExistsError):
        write_secret(tmp_path / "a.password", "secret")
    assert not target.exists()
    assert [path.name for path in tmp_path.iterdir()] == ["a.password"], "no partial file left"


HOSTILE = [
    "it's",
    "'; touch {canary}; '",
    '"; touch {canary}; "',
    "$(touch {canary})",
    "`touch {canary}`",
    "a\nb; touch {canary}",
    "\\' ; touch {canary} #",
    "",
]


@pytest.mark.parametrize("template", HOSTILE)
def test_stack_env_output_cannot_run_shell(tmp_path: Path, template: str) -> None:
    """`eval "$(outbox stack env)"` with a value holding quotes, $(), backticks or newlines:
    the shell gets the value back byte for byte and runs nothing."""
    canary = tmp_path / "canary"
    value = template.format(canary=canary)
    lines = shell_exports({"OUTBOX_TEST_VALUE": value, "OUTBOX_OTHER": "x"})
    result = subprocess.run(
        ["bash", "-c", 'eval "$LINES" && printf %s "$OUTBOX_TEST_VALUE"'],
        env={"LINES": lines, "PATH": os.environ["PATH"]},
        capture_output=True,
        text=True,
        timeout=10,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == value
    assert not canary.exists(), "a value ran a command"


def test_bootstrap_lists_compare_as_sets_of_servers() -> None:
    assert same_servers("127.0.0.1:59092", " localhost:59092 ")
    assert same_servers("a:1,b:2", "b:2, a:1")
    assert not same_servers("127.0.0.1:59092", "127.0.0.1:59093")
    assert not same_servers("127.0.0.1:59092", "127.0.0.1:59092,kafka:9092")


def test_stack_env_exports_a_generated_relay_password_of_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, open_umask: None
) -> None:
    """The relay recipe (`outbox db relay-role`, then the relay as that role) needs
    OUTBOX_RELAY_DATABASE_PASSWORD: `stack env` exports one, generated once (0600), apart
    from the CDC role's; a value set in the environment wins, as for the CDC password."""
    from outbox.settings import KafkaSettings
    from outbox_stack.local import LocalStack
    from outbox_stack.settings import StackSettings

    for name in ("OUTBOX_RELAY_DATABASE_PASSWORD", "OUTBOX_CONNECT_DATABASE_PASSWORD"):
        monkeypatch.delenv(name, raising=False)
    stack = LocalStack(StackSettings(dir=tmp_path), KafkaSettings())
    stack.postgres.home.mkdir(parents=True)
    write_secret(stack.postgres.password_file, "superuser-secret\n")
    exported = stack.environment()
    password = exported["OUTBOX_RELAY_DATABASE_PASSWORD"]
    assert len(password) >= 24 and password != exported["OUTBOX_CONNECT_DATABASE_PASSWORD"]
    assert (stack.postgres.home / "relay.password").stat().st_mode & 0o777 == 0o600
    assert stack.environment()["OUTBOX_RELAY_DATABASE_PASSWORD"] == password, "kept"
    monkeypatch.setenv("OUTBOX_RELAY_DATABASE_PASSWORD", "chosen")
    assert stack.environment()["OUTBOX_RELAY_DATABASE_PASSWORD"] == "chosen"


def test_stack_env_points_tracing_at_jaeger_with_kafka_instrumentation_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, open_umask: None
) -> None:
    """With the opt-in Jaeger, `stack env` exports OpenTelemetry's own variables, the
    kafka-python auto-instrumentation off (its second traceparent header would make copies
    of one event differ); without it, none of them."""
    from outbox.settings import KafkaSettings
    from outbox_stack.local import LocalStack
    from outbox_stack.settings import StackSettings

    def exported(tracing: bool) -> dict[str, str]:
        stack = LocalStack(StackSettings(dir=tmp_path, tracing=tracing), KafkaSettings())
        if not stack.postgres.password_file.exists():
            stack.postgres.home.mkdir(parents=True)
            write_secret(stack.postgres.password_file, "superuser-secret\n")
        return stack.environment()

    traced = exported(True)
    assert traced["OTEL_EXPORTER_OTLP_ENDPOINT"].startswith("http://127.0.0.1:")
    assert traced["OTEL_TRACES_EXPORTER"] == "otlp"
    assert traced["OTEL_PYTHON_DISABLED_INSTRUMENTATIONS"] == "kafka"
    assert not any(name.startswith("OTEL_") for name in exported(False))
