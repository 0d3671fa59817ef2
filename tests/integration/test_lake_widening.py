"""Money first seen as an integer, later as a ``Decimal``: the typed table's ``bigint``
column widens to ``decimal(38,18)`` (the table rewritten in one Delta commit), both rows
land, nothing is set aside, and every reader still reads the table: Spark, ``deltalake``,
DuckDB through ``outbox lake query``, and reconcile's lake reader. Real Spark, real Delta,
records produced to the test Kafka."""

from __future__ import annotations

import uuid
from decimal import Decimal
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from deltalake import DeltaTable

from outbox import new_event_id
from outbox.core.payload import encode_json
from outbox_lake.names import typed_table_name
from tests.cli import run_outbox
from tests.fix_lake import contract_record, ingested, lake_env, rows, send, shared_spark
from tests.fix_stack import KafkaServices

pytestmark = pytest.mark.timeout(600)


def produce(bootstrap: str, aggregate_type: str, payloads: list[dict[str, Any]]) -> list[str]:
    """Records as the SDK writes them (a ``Decimal`` as a JSON number: ``9.90``); their ids."""
    ids = [new_event_id() for _ in payloads]
    records = [
        contract_record(
            aggregate_type, encode_json(payload), event_id=event_id, aggregate_id=str(event_id)
        )
        for event_id, payload in zip(ids, payloads, strict=True)
    ]
    send(bootstrap, [(r.topic, r.key, r.value, list(r.headers)) for r in records])
    return [str(event_id) for event_id in ids]


def kinds(root: Path, table: str) -> dict[str, str]:
    return {f.name: str(f.type.type) for f in DeltaTable(str(root / table)).schema().fields}


def amounts(root: Path, table: str) -> dict[str, Decimal]:
    return {row["event_id"]: row["amount"] for row in rows(root, table)}


def test_an_integer_column_widens_to_decimal_when_a_fraction_arrives(
    kafka_services: KafkaServices, tmp_path: Path
) -> None:
    from outbox_lake.query import run_sql
    from outbox_lake.settings import LakeSettings
    from outbox_reconcile.evidence import Evidence
    from outbox_reconcile.lake_reader import read_lake
    from outbox_reconcile.records import Window

    bootstrap = kafka_services.bootstrap_servers
    prefix = f"w{uuid.uuid4().hex[:8]}"
    payment, once = f"{prefix}payment", f"{prefix}once"
    table, once_table = typed_table_name(payment), typed_table_name(once)
    root = tmp_path / "lake"
    env = lake_env(root, prefix, bootstrap)

    first = produce(bootstrap, payment, [{"amount": 10, "fee.net": 1, "payer-id": "p"}])
    # in one batch, a new field's first value an integer, then a fraction: decimal at once
    both = produce(bootstrap, once, [{"amount": 10}, {"amount": Decimal("9.90")}])
    ingested(env)
    assert kinds(root, table)["amount"] == "long"
    assert kinds(root, once_table)["amount"] == "decimal(38,18)"
    assert amounts(root, once_table) == {both[0]: Decimal(10), both[1]: Decimal("9.90")}

    second = produce(bootstrap, payment, [{"amount": Decimal("9.90")}])
    ingested(env)

    # Both rows in the typed table, the column decimal(38,18), nothing set aside.
    assert kinds(root, table)["amount"] == "decimal(38,18)"
    assert amounts(root, table) == {first[0]: Decimal(10), second[0]: Decimal("9.90")}
    assert rows(root, "quarantine") == []
    kept = next(row for row in rows(root, table) if row["event_id"] == first[0])
    assert (kept["fee.net"], kept["payer-id"]) == (1, "p")  # other columns as they were
    assert kinds(root, table)["fee.net"] == "long"
    assert sum(amounts(root, table).values()) == Decimal("19.90")
    widened = DeltaTable(str(root / table))
    protocol = widened.protocol()  # no table feature: every reader reads it
    assert (protocol.min_reader_version, protocol.min_writer_version) == (1, 2)
    assert protocol.reader_features is None and protocol.writer_features is None
    assert widened.metadata().name == payment  # the typed table's owner, kept
    assert widened.metadata().partition_columns == ["event_date"]
    overwrites = [
        commit
        for commit in widened.history()
        if commit.get("operationParameters", {}).get("mode") == "Overwrite"
    ]
    assert len(overwrites) == 1, overwrites

    # Spark SQL reads it.
    spark = shared_spark()
    [[summed, kind]] = spark.sql(
        f"SELECT sum(amount), typeof(sum(amount)) FROM delta.`{root / table}`"
    ).collect()
    assert summed == Decimal("19.90") and kind == "decimal(38,18)", (summed, kind)
    # DuckDB through deltalake and Arrow, as the analysts' guide shows.
    settings = LakeSettings(root=str(root))
    assert run_sql(settings, f"SELECT sum(amount), count(*) FROM {table}")[1] == [
        (Decimal("19.90"), 2)
    ]
    answer = run_outbox(
        "lake", "query", "--format", "csv", f"SELECT sum(amount) AS s FROM {table}", env=env
    )
    assert answer.returncode == 0, answer.stderr
    assert Decimal(answer.stdout.splitlines()[1]) == Decimal("19.90"), answer.stdout
    # Reconcile's lake reader (deltalake) reads the widened table's ids.
    evidence = Evidence()
    try:
        read = read_lake(settings, evidence, Window(), [])
        assert read.typed_tables[table] == widened.version()
        typed_ids = {
            event_id
            for (event_id,) in evidence.db.execute(
                "SELECT event_id FROM typed WHERE typed_table = ?", (table,)
            )
        }
        assert typed_ids == {first[0], second[0]}
    finally:
        evidence.close()

    # Later integers go into the decimal column.
    third = produce(bootstrap, payment, [{"amount": 5}])
    ingested(env)
    assert kinds(root, table)["amount"] == "decimal(38,18)"
    assert amounts(root, table)[third[0]] == Decimal(5)
    assert sum(amounts(root, table).values()) == Decimal("24.90")
    assert rows(root, "quarantine") == []


def test_a_crash_between_the_widening_and_the_append_loses_no_row(
    kafka_services: KafkaServices, tmp_path: Path
) -> None:
    """The widening is its own Delta commit; the typed query stopped right after it runs its
    batch again: the column is decimal already, the fraction lands, nothing twice."""
    from outbox_lake import typed

    bootstrap = kafka_services.bootstrap_servers
    prefix = f"w{uuid.uuid4().hex[:8]}"
    payment = f"{prefix}payment"
    table = typed_table_name(payment)
    root = tmp_path / "lake"
    env = lake_env(root, prefix, bootstrap)
    first = produce(bootstrap, payment, [{"amount": 10}, {"amount": 7}])
    ingested(env)
    assert kinds(root, table)["amount"] == "long"

    second = produce(bootstrap, payment, [{"amount": Decimal("9.90")}, {"amount": 3}])
    real = typed.widen_to_decimal

    def widen_then_crash(*args: Any) -> None:
        real(*args)
        raise RuntimeError("the job died after the widening commit")

    with (
        mock.patch.object(typed, "widen_to_decimal", widen_then_crash),
        pytest.raises(Exception, match="the job died after the widening commit"),
    ):
        ingested(env)
    # The widening committed; the batch's fraction did not land (its integer did, before).
    assert kinds(root, table)["amount"] == "decimal(38,18)"
    assert set(amounts(root, table)) == {*first, second[1]}

    ingested(env)  # the batch again
    landed = rows(root, table)
    assert len(landed) == 4 and {row["event_id"] for row in landed} == {*first, *second}
    assert sum(row["amount"] for row in landed) == Decimal("29.90")
    assert rows(root, "quarantine") == []


def test_a_new_table_s_columns_come_from_each_field_s_first_record_past_the_first_ones(
    kafka_services: KafkaServices, tmp_path: Path
) -> None:
    """A new typed table is created from its batch's first records; a field first brought
    later in the same batch is added (and a column it widens, widened), in the order and
    kind of the record that first brought it: as if every record had been read first."""
    from outbox_lake.typed import FIRST_RECORDS

    bootstrap = kafka_services.bootstrap_servers
    late = f"n{uuid.uuid4().hex[:8]}late"
    root = tmp_path / "lake"
    env = lake_env(root, late, bootstrap)
    payloads: list[dict[str, Any]] = [{"a": n} for n in range(FIRST_RECORDS + 200)]
    payloads[0]["c"] = 1
    payloads[FIRST_RECORDS + 100] |= {"b": "x", "c": Decimal("2.5")}
    ids = [new_event_id() for _ in payloads]
    records = [  # one key: one partition, the records' order is their offsets'
        contract_record(late, encode_json(payload), event_id=event_id, aggregate_id="one")
        for event_id, payload in zip(ids, payloads, strict=True)
    ]
    send(bootstrap, [(r.topic, r.key, r.value, list(r.headers)) for r in records])
    ingested(env)
    table = typed_table_name(late)
    fields = [f.name for f in DeltaTable(str(root / table)).schema().fields]
    assert [name for name in fields if name in ("a", "b", "c")] == ["a", "c", "b"]
    assert (kinds(root, table)["a"], kinds(root, table)["b"]) == ("long", "string")
    assert kinds(root, table)["c"] == "decimal(38,18)"
    typed = {row["event_id"]: row for row in rows(root, table)}
    assert sorted(typed) == sorted(map(str, ids)), "a typed row lost or doubled"
    assert typed[str(ids[0])]["c"] == Decimal(1)
    assert (typed[str(ids[-100])]["b"], typed[str(ids[-100])]["c"]) == ("x", Decimal("2.5"))
    assert rows(root, "quarantine") == []
