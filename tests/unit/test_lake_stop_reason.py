"""Why the lake job stopped, in one line, from Spark's exception text or the job's log."""

from __future__ import annotations

from outbox_lake.offsets import BrokerPartition, Partition, Progress, losses
from outbox_lake.stop_reason import SPARK_DATA_LOSS, TOPIC_REPLACED, stop_reason

JAVA_WRAPPED = (
    "An exception was thrown from the Python worker. Please see the stack trace below.\n"
    "Traceback (most recent call last):\n"
    '  File "job.py", line 10, in check\n'
    "outbox.core.errors.DataLossError: the partition ends at offset 3, below offset 9\n"
    "\tat org.apache.spark.api.python.BasePythonRunner...\n"
)


def test_our_error_is_found_inside_the_java_exception_text() -> None:
    assert stop_reason(JAVA_WRAPPED) == (
        "DataLossError: the partition ends at offset 3, below offset 9"
    )


def test_the_last_refusal_of_a_log_is_the_reason() -> None:
    log = "DataLossError: first\nsome line\nConfigurationError: the servers are wrong\n"
    assert stop_reason(log) == "ConfigurationError: the servers are wrong"


def test_spark_own_data_loss_words_become_a_data_loss_with_the_way_on() -> None:
    text = (
        "25/11/26 WARN BlockManager: Block broadcast_3 lost, executor lost\n"  # not the one
        "org.apache.spark.SparkIllegalStateException: [KAFKA_DATA_LOSS.START_OFFSET_RESET] "
        f"{SPARK_DATA_LOSS}, because the data is no longer available in Kafka\n\tat ..."
    )
    reason = stop_reason(text)
    assert reason is not None and reason.startswith("DataLossError: ")
    assert SPARK_DATA_LOSS in reason and "KAFKA_DATA_LOSS.START_OFFSET_RESET" in reason
    assert "Block broadcast_3" not in reason
    assert "OUTBOX_LAKE_FAIL_ON_DATA_LOSS=false" in reason
    changed = stop_reason("java.lang.IllegalStateException: Partition t-0's offset was changed")
    assert changed is not None and SPARK_DATA_LOSS in changed


def test_text_without_a_reason_gives_none() -> None:
    assert stop_reason("java.lang.OutOfMemoryError: Java heap space") is None


def test_the_refusal_for_a_replaced_topic_says_the_words_the_demo_looks_for() -> None:
    where = Partition("outbox.event.order", 0)
    known = Progress(end_offset=5, last_record="abc", topic_id="old")
    [loss] = losses({where: known}, {where: BrokerPartition(earliest=0, latest=5, topic_id="new")})
    assert loss.what.startswith(TOPIC_REPLACED)
