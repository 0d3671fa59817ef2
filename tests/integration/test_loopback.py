"""Every listener the project starts is on loopback: PostgreSQL, the broker, Kafka Connect
and a Spark session of the lake job, found from the kernel's socket tables (/proc/net)."""

from __future__ import annotations

import ipaddress
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from outbox_stack import PostgresCluster
from tests.fix_postgres import ROOT
from tests.fix_stack import KafkaServices

pytestmark = pytest.mark.timeout(240)

LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp's state column

SPARK_DRIVER = """
import sys
from outbox_cli.lake import with_spark_jars
from outbox_lake.session import spark_session
from outbox_lake.settings import LakeSettings
spark = spark_session(with_spark_jars(LakeSettings()))  # Kafka's and Delta's jars, as the job
spark.range(10).count()  # executors and the block manager are up
print("ready", flush=True)
sys.stdin.read()  # until the test closes our stdin
spark.stop()
"""


def _address(hex_address: str) -> str:
    raw = bytes.fromhex(hex_address)
    # /proc/net/tcp{,6} print each 32-bit word in host (little-endian) order.
    parsed = ipaddress.ip_address(b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4)))
    if isinstance(parsed, ipaddress.IPv6Address) and parsed.ipv4_mapped is not None:
        return str(parsed.ipv4_mapped)  # an IPv6 socket bound to an IPv4 address
    return str(parsed)


def listeners() -> dict[int, tuple[str, int]]:
    """Listening TCP sockets by inode: (address, port)."""
    found: dict[int, tuple[str, int]] = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] != LISTEN:
                continue
            hex_address, hex_port = fields[1].split(":")
            found[int(fields[9])] = (_address(hex_address), int(hex_port, 16))
    return found


def socket_inodes(pid: int) -> set[int]:
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue  # closed meanwhile
        if target.startswith("socket:["):
            inodes.add(int(target[8:-1]))
    return inodes


def with_descendants(pid: int) -> set[int]:
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parents[int(stat.parent.name)] = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError):
            continue
    family = {pid}
    while True:
        more = {child for child, parent in parents.items() if parent in family} - family
        if not more:
            return family
        family |= more


def listening_on(pids: set[int]) -> list[tuple[str, int]]:
    table = listeners()
    return sorted(table[inode] for pid in pids for inode in socket_inodes(pid) if inode in table)


def is_loopback(address: str) -> bool:
    return ipaddress.ip_address(address).is_loopback


@pytest.fixture
def spark_driver(tmp_path: Path) -> Iterator[subprocess.Popen[str]]:
    """A Spark session as the lake job makes it (`outbox_lake.session`), in a process."""
    process = subprocess.Popen(
        [sys.executable, "-c", SPARK_DRIVER],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        cwd=tmp_path,
        env={
            **os.environ,
            "OUTBOX_LAKE_ROOT": str(tmp_path / "lake"),
            "OUTBOX_STACK_DOWNLOADS": str(ROOT / ".cache" / "stack"),  # the fetched jars
        },
    )
    try:
        assert process.stdout is not None
        assert process.stdout.readline().strip() == "ready", "the Spark session did not start"
        yield process
    finally:
        assert process.stdin is not None
        process.stdin.close()
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


def test_every_listener_of_the_stack_and_spark_is_on_loopback(
    cluster: PostgresCluster,
    kafka_services: KafkaServices,
    spark_driver: subprocess.Popen[str],
) -> None:
    services = {
        "postgres": cluster.pid(),
        "broker": kafka_services.broker.process.pid(),
        "connect": kafka_services.connect.process.pid(),
        "spark": spark_driver.pid,
    }
    found = {}
    deadline = time.monotonic() + 30
    for name, pid in services.items():
        assert pid is not None, f"{name} is not running"
        while True:  # a service may still be opening a listener it announced
            found[name] = listening_on(with_descendants(pid))
            if found[name] or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert found[name], f"no listener found for {name}: the test would prove nothing"
    outside = {
        name: [(address, port) for address, port in sockets if not is_loopback(address)]
        for name, sockets in found.items()
    }
    assert not any(outside.values()), f"listening outside loopback: {outside}"
    assert ("127.0.0.1", cluster.port) in found["postgres"]
    assert ("127.0.0.1", kafka_services.settings.broker_port) in found["broker"]
    assert ("127.0.0.1", kafka_services.settings.connect_port) in found["connect"]
    assert len(found["spark"]) >= 2, "the driver's RPC and block manager at least"


def test_a_listener_outside_loopback_is_seen() -> None:
    """The check itself: a socket on every address is found and not taken for loopback."""
    with socket.socket(socket.AF_INET6) as probe:
        probe.bind(("::", 0))
        probe.listen()
        port = probe.getsockname()[1]
        found = listening_on({os.getpid()})
    assert ("::", port) in found and not is_loopback("::")
