"""The lake job as the tests run it: its settings, a run over what Kafka holds now, the
continuous job in a process group of its own, the tables' rows, and contract records sent
straight to the broker."""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any
from unittest import mock

from deltalake import DeltaTable
from kafka import KafkaProducer

from outbox import new_event_id
from outbox.core.contract import ContractRecord, record_for
from tests.cli import run_outbox
from tests.fix_postgres import ROOT

if TYPE_CHECKING:
    from outbox_lake.metrics import LakeMetrics


def lake_env(root: Path | str, prefix: str, bootstrap: str, **extra: str) -> dict[str, str]:
    """The job's settings: the lake at ``root``, the topics of aggregate types starting with
    ``prefix``, a 1 s trigger; ``extra`` on top."""
    return {
        "OUTBOX_LAKE_ROOT": str(root),
        "OUTBOX_LAKE_TOPIC_PATTERN": rf"^outbox\.event\.{prefix}.*",
        "OUTBOX_KAFKA_BOOTSTRAP_SERVERS": bootstrap,
        "OUTBOX_LAKE_TRIGGER_SECONDS": "1",
        **extra,
    }


def ingest(env: dict[str, str], *, timeout: float = 400) -> subprocess.CompletedProcess[str]:
    """``outbox lake ingest --available-now``: what Kafka holds now, then stop."""
    return run_outbox("lake", "ingest", "--available-now", env=env, timeout=timeout)


IN_PROCESS_SETTINGS = frozenset(
    {
        "OUTBOX_LAKE_ROOT",
        "OUTBOX_LAKE_TOPIC_PATTERN",
        "OUTBOX_LAKE_TRIGGER_SECONDS",
        "OUTBOX_LAKE_MAX_RECORDS_PER_BATCH",
        "OUTBOX_LAKE_FAIL_ON_DATA_LOSS",
        "OUTBOX_KAFKA_BOOTSTRAP_SERVERS",
    }
)
"""Settings an in-process run takes: none of them is one of the Spark session's own (its
master, jars, object store), which the suite's runs share."""

_shared_spark: Any = None


def ingested(env: dict[str, str], *, timeout: float = 400) -> LakeMetrics | None:
    """The job over what Kafka holds now, which must succeed.

    A local lake with only :data:`IN_PROCESS_SETTINGS` runs in this process: the job's own
    ``Ingest.run(stop, available_now=True)``, as ``outbox lake ingest --available-now`` calls it,
    on one Spark session all such runs of the suite share (its JVM stays warm: a run takes
    seconds instead of a minute). Any other runs the command (:func:`ingested_by_command`).
    The command's own behaviour (exit codes, messages, signals, kills) is tested through
    :func:`ingest` and :func:`continuous_ingest`."""
    if set(env) <= IN_PROCESS_SETTINGS:
        metrics = ingest_in_process(env)
        if metrics is not None:
            return metrics
    ingested_by_command(env, timeout=timeout)
    return None


def ingested_by_command(
    env: dict[str, str], *, timeout: float = 400
) -> subprocess.CompletedProcess[str]:
    """:func:`ingest`, which must exit 0 without a traceback."""
    done = ingest(env, timeout=timeout)
    assert done.returncode == 0, done.stderr[-4000:]
    assert "Traceback" not in done.stderr, done.stderr[-4000:]
    assert re.search(
        r"^lake ingest: [\d,]+ batches \([\d,]+ in two jobs\), [\d,]+ events landed",
        done.stderr,
        re.M,
    ), "the job ends with its summary line"
    return done


def refusal(env: dict[str, str], *, by_command: bool = False) -> str:
    """The job's refusal to ingest what Kafka holds now, in the words ``outbox lake ingest``
    stops with (its stop reason). In this process on the shared session, as
    :func:`ingested` runs the job, unless ``by_command`` (or a setting of the Spark
    session's own): then the command, which must exit 1 and say it in a line of its own."""
    if not by_command and set(env) <= IN_PROCESS_SETTINGS:
        from outbox.core.errors import OutboxError

        try:
            ran = ingest_in_process(env)
        except OutboxError as error:  # what the command says after "lake ingest stopped: "
            return f"lake ingest stopped: {type(error).__name__}: {error}"
        assert ran is None, "the job ingested what it had to refuse"
    done = ingest(env)
    assert done.returncode == 1, (done.returncode, done.stderr[-3000:])
    said = [line for line in done.stderr.splitlines() if line.startswith("lake ingest stopped: ")]
    assert said, done.stderr[-3000:]
    return said[0]


def ingest_in_process(env: dict[str, str]) -> LakeMetrics | None:
    """Run the job here on the shared session: its metrics; None (nothing run) for a lake
    that is not local (its store's settings are the Spark session's)."""
    from outbox_cli._common import kafka_settings, load
    from outbox_cli.lake import with_spark_jars
    from outbox_lake.ingest import Ingest
    from outbox_lake.metrics import LakeMetrics
    from outbox_lake.settings import LakeSettings

    with mock.patch.dict(os.environ, env):
        settings = load(LakeSettings)
        if not settings.is_local:
            return None
        settings = with_spark_jars(settings)
        kafka = kafka_settings()
    metrics = LakeMetrics()
    Ingest(shared_spark(settings), settings, kafka, metrics).run(
        threading.Event(), available_now=True
    )
    return metrics


def shared_spark(settings: Any = None) -> Any:
    """The suite's one Spark session (as the lake job makes it), started on first use."""
    from outbox_cli.lake import with_spark_jars
    from outbox_lake.session import spark_session
    from outbox_lake.settings import LakeSettings

    global _shared_spark
    if _shared_spark is None:
        _shared_spark = spark_session(settings or with_spark_jars(LakeSettings()))
    return _shared_spark


def stop_shared_spark() -> None:
    """At the end of the session: the in-process runs' Spark session, its gateway (closed
    now, not by the garbage collector at exit) and its JVM. Logging is off meanwhile: py4j
    logs each connection it closes, and the CLI's tests leave the root logger writing to a
    stream their runner has closed ("--- Logging error ---" tracebacks otherwise)."""
    global _shared_spark
    if _shared_spark is None:
        return
    from pyspark import SparkContext

    logging.disable(logging.CRITICAL)
    try:
        _shared_spark.stop()
        _shared_spark = None
        gateway = SparkContext._gateway
        if gateway is None:
            return
        gateway.shutdown()
        SparkContext._gateway = None
        SparkContext._jvm = None
        jvm = getattr(gateway, "proc", None)
        if jvm is not None:
            jvm.stdin.close()  # Spark's JVM exits when its standard input closes
            jvm.wait(timeout=60)
    finally:
        logging.getLogger("py4j").setLevel(logging.WARNING)  # its objects' finalizers log too
        logging.disable(logging.NOTSET)


@contextlib.contextmanager
def continuous_ingest(env: dict[str, str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """``outbox lake ingest`` running, its output in ``log``, in a process group of its own
    (the driver and Spark's JVM: a test's ``os.killpg`` kills both); killed on exit if the
    test left it running."""
    with log.open("wb") as out:
        job = subprocess.Popen(
            [sys.executable, "-m", "outbox_cli.main", "lake", "ingest"],
            env={**os.environ, "PYTHONPATH": str(ROOT), **env},
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        yield job
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait(timeout=30)


def batches_landed(root: Path, table: str = "events") -> int:
    """Commits in a local table's log (0 before it exists)."""
    log = root / table / "_delta_log"
    return len(list(log.glob("*.json"))) if log.exists() else 0


def rows(root: Path, table: str) -> list[dict[str, Any]]:
    return DeltaTable(str(root / table)).to_pyarrow_table().to_pylist()  # type: ignore[no-any-return]


def send(
    bootstrap: str, records: list[tuple[str, bytes | None, bytes | None, list[Any]]]
) -> list[Any]:
    """Produce ``(topic, key, value, headers)`` records; their metadata, once acknowledged."""
    producer = KafkaProducer(bootstrap_servers=bootstrap, max_request_size=8_000_000)
    try:
        futures = [
            producer.send(topic, key=key, value=value, headers=headers)
            for topic, key, value, headers in records
        ]
        producer.flush()
        return [future.get(timeout=30) for future in futures]
    finally:
        producer.close()


def contract_record(aggregate_type: str, payload_text: str, **parts: Any) -> ContractRecord:
    """A record as the outbox writes it (``parts``: event_id, aggregate_id, event_type,
    position)."""
    return record_for(
        event_id=parts.get("event_id", new_event_id()),
        aggregate_type=aggregate_type,
        aggregate_id=parts.get("aggregate_id", "1"),
        event_type=parts.get("event_type", "Happened"),
        payload_text=payload_text,
        headers_text="{}",
        traceparent="",
        position=parts.get("position", 1),
    )
