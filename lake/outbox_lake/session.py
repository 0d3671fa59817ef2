"""The job's Spark session: its settings as a pure mapping (:func:`spark_conf`), then the
session itself (:func:`spark_session`).

What each setting is for:

- loopback by default (``spark.driver.host``/``bindAddress``, ``SPARK_LOCAL_IP``), no UI;
- secrets redacted wherever Spark shows options (Kafka's SASL JAAS line, a client key);
- Delta's extension and catalog; empty appends committed (a batch of duplicates only still
  records the lake's progress in ``events``);
- **a micro-batch's fixed cost cut** (benchmarks/notes.md, "The lake at stream speed"): two
  shuffle partitions and two snapshot partitions (small batches, two cores); no adaptive
  execution (it replans every small batch); no checksum file per Delta commit; a Delta
  checkpoint every 100 commits instead of 10 (a one-second trigger would otherwise write a
  checkpoint every ten seconds); ten batches of streaming metadata kept instead of 100;
  generated code compiled however large (the contract's expressions are one large method);
- a trigger with no new data reports progress at once (the loop and the demo wait on it);
- two scheduler pools (``fairscheduler.xml``): the freshness path's jobs take the task
  slots first, the typed query's what is left.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from outbox_lake.storage import hadoop_conf

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from outbox_lake.settings import LakeSettings

__all__ = [
    "FRESHNESS_POOL",
    "SPARK_REDACTION_REGEX",
    "TUNED",
    "TYPED_POOL",
    "spark_conf",
    "spark_session",
]

_LOG4J2 = Path(__file__).with_name("log4j2.properties")
_POOLS = Path(__file__).with_name("fairscheduler.xml")
FRESHNESS_POOL = "freshness"
TYPED_POOL = "typed"
"""Scheduler pools: the Kafka query's jobs first, the typed query's with what is left."""
SPARK_REDACTION_REGEX = r"(?i)secret|password|token|access[.]?key|jaas|ssl[.]keystore[.]key|url"

_JIT = "-XX:-DontCompileHugeMethods"
"""The contract's expressions make one generated method over 8,000 bytes of bytecode, which
the JVM would never compile: compiled, the contract costs half (with
``spark.sql.codegen.hugeMethodLimit``, as Spark's docs advise)."""

TUNED = {
    "spark.sql.shuffle.partitions": "2",
    "spark.databricks.delta.snapshotPartitions": "2",
    "spark.sql.adaptive.enabled": "false",
    "spark.databricks.delta.writeChecksumFile.enabled": "false",
    "spark.databricks.delta.properties.defaults.checkpointInterval": "100",
    "spark.sql.streaming.minBatchesToRetain": "10",
    "spark.sql.codegen.hugeMethodLimit": "65535",
}
"""What cuts a micro-batch's fixed cost; the benchmark gives Spark's own sink the same."""


def spark_conf(settings: LakeSettings) -> dict[str, str]:
    """Every Spark setting of the job, from the lake's settings (pure)."""
    conf = {
        "spark.master": settings.spark_master,
        "spark.app.name": settings.query_name,
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile={_LOG4J2} {_JIT}",
        "spark.executor.extraJavaOptions": _JIT,
        "spark.driver.host": settings.spark_bind_address,
        "spark.driver.bindAddress": settings.spark_bind_address,
        "spark.sql.session.timeZone": "UTC",
        "spark.redaction.regex": SPARK_REDACTION_REGEX,
        "spark.sql.redaction.options.regex": SPARK_REDACTION_REGEX,
        "spark.driver.memory": "1g",
        "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
        "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
        # A batch with no new event still commits to events: its commit carries the progress.
        "spark.databricks.delta.skipRecordingEmptyCommits": "false",
        **TUNED,
        "spark.sql.streaming.noDataProgressEventInterval": "500ms",
        "spark.scheduler.mode": "FAIR",
        "spark.scheduler.allocation.file": str(_POOLS),
        **hadoop_conf(settings),  # s3:// roots; never a credential
    }
    if settings.spark_jars:
        conf["spark.jars"] = settings.spark_jars
    if settings.spark_packages:
        conf["spark.jars.packages"] = settings.spark_packages
    return conf


def spark_session(settings: LakeSettings) -> SparkSession:
    """The job's Spark session. Spark's JVM runs in a session (process group) of its own:
    a SIGTERM or Ctrl-C sent to the job's process group reaches the driver only, which
    finishes the batch under way and stops the JVM itself (it also exits when the driver
    dies: its standard input closes)."""
    from pyspark import SparkConf, SparkContext
    from pyspark.java_gateway import launch_gateway
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    # Loopback only: otherwise the driver resolves the hostname and listens on eth0. The
    # variable reaches the JVM Spark starts (and its executors), the settings the driver.
    os.environ.setdefault("SPARK_LOCAL_IP", settings.spark_bind_address)
    conf = SparkConf()
    for name, value in spark_conf(settings).items():
        conf.set(name, value)
    if SparkContext._gateway is None:
        gateway = launch_gateway(conf, popen_kwargs={"start_new_session": True})  # type: ignore[no-untyped-call]
        SparkContext._ensure_initialized(gateway=gateway, conf=conf)
    spark = SparkSession.builder.config(conf=conf).getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark
