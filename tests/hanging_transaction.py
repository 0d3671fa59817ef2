"""A hanging transaction (KIP-664) on a real broker, made on purpose: a transactional write
to a partition that the transaction's coordinator never hears of, whose producer then dies.
The coordinator has nothing to time out, so Kafka never ends it: every ``read_committed``
reader of the partition stops at its first record until an operator aborts it.

The broker would refuse such a write (KIP-890's partition verification); it is switched off
for the write only, on that broker, and switched back on. The producer runs in a process of
its own (``python -m tests.hanging_transaction BOOTSTRAP TOPIC``) that exits without ending
its transaction, as a crashed one would.
"""

from __future__ import annotations

import os
import subprocess
import sys

from tests.fix_postgres import ROOT

_VERIFICATION = "transaction.partition.verification.enable"


def _set_verification(admin: object, broker_id: int, enabled: bool) -> None:
    from kafka.admin import ConfigResource, ConfigResourceType

    value = "true" if enabled else "false"
    resource = ConfigResource(ConfigResourceType.BROKER, str(broker_id), {_VERIFICATION: value})
    admin.alter_configs([resource])  # type: ignore[attr-defined]


def leave_hanging_transaction(bootstrap: str, topic: str) -> None:
    """Leave a hanging transaction on ``topic``'s partition 0 (one record, keyed, so that a
    compacted topic takes it too)."""
    from kafka import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    broker_id = admin.describe_cluster()["brokers"][0]["broker_id"]
    _set_verification(admin, broker_id, enabled=False)
    try:
        subprocess.run(
            [sys.executable, "-m", "tests.hanging_transaction", bootstrap, topic],
            cwd=ROOT,
            check=True,
            timeout=90,
        )
    finally:
        _set_verification(admin, broker_id, enabled=True)
        admin.close()


def _write_and_die(bootstrap: str, topic: str) -> None:
    from kafka import KafkaProducer

    producer = KafkaProducer(
        bootstrap_servers=bootstrap,
        transactional_id=f"tests-hanging-{os.getpid()}",
        metrics_enabled=False,
    )
    producer.init_transactions()
    manager = producer._transaction_manager
    # The partition counts as added without telling the coordinator: no AddPartitionsToTxn.
    manager.maybe_add_partition_to_transaction = manager._partitions_in_transaction.add
    producer.begin_transaction()
    producer.send(topic, key=b"tests-hanging", value=b"never committed", partition=0).get(30)
    os._exit(0)  # no abort, no commit: the producer is gone


if __name__ == "__main__":
    _write_and_die(sys.argv[1], sys.argv[2])
