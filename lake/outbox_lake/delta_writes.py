"""The one way the job writes a lake table: an append of the rows whose key the table lacks.

Both queries write this way (``events`` and ``quarantine`` from the Kafka query, the typed
tables and ``quarantine`` from the typed query). A key the table has already (a copy read
again after a crash, a deleted checkpoint, a second delivery path) is left out by one
left-anti join against the table, read only where the batch's keys can be: each event id
range of the batch (UUIDv7 ids are time-ordered, so Delta's file statistics on
``event_id`` prune every file whose range does not meet one) within its days (the
``event_date`` partitions). Then one append: a single Delta commit, with the options given
(``userMetadata`` carries the lake's progress on ``events``).

The job is the one writer of its lake root (docs/production.md): the anti-join reads the
table as the previous commit of this writer left it.

Tables are created by ``deltalake`` (protocol 1/2, no table feature: every reader reads
them; a typed table records its aggregate type as the Delta metadata name).
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from datetime import date
from typing import TYPE_CHECKING, Any

from outbox_lake.settings import LakeSettings
from outbox_lake.storage import is_table, open_table, storage_options

if TYPE_CHECKING:
    from deltalake import DeltaTable
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.types import StructType

__all__ = [
    "IdRange",
    "PendingAppend",
    "append",
    "append_absent",
    "create_table",
    "id_ranges",
    "ids_of",
    "ranges_of",
    "within",
]

log = logging.getLogger("outbox.lake.writes")

TABLE_PROPERTIES = {
    "delta.checkpointInterval": "100",
    "delta.dataSkippingStatsColumns": "event_id,event_time,position",
}
"""Every table's properties: a Delta checkpoint every 100 commits (not 10: with a one-second
trigger, one every ten seconds), and file statistics on the columns reads are bounded by
(``event_id`` above all: the dedup's reads are pruned by it), not on every column
(statistics on payloads cost each write and serve no read)."""

MAX_RANGES = 64
"""At most this many id ranges bound a read; more are merged (a wider read, never a miss)."""


@dataclass(frozen=True, order=True)
class IdRange:
    """Event ids of one day between two bounds (both included)."""

    day: date
    low: str
    high: str


def id_ranges(found: Iterable[IdRange], limit: int = MAX_RANGES) -> list[IdRange]:
    """The ranges, sorted, with overlapping ones of a day merged, and neighbours merged
    until at most ``limit`` remain (pure)."""
    merged: list[IdRange] = []
    for item in sorted(found):
        last = merged[-1] if merged else None
        if last is not None and last.day == item.day and item.low <= last.high:
            merged[-1] = IdRange(last.day, last.low, max(last.high, item.high))
        else:
            merged.append(item)
    while len(merged) > limit:
        # merge the two neighbours of one day closest together (by their first characters)
        pairs = [
            (i, _gap(merged[i], merged[i + 1]))
            for i in range(len(merged) - 1)
            if merged[i].day == merged[i + 1].day
        ]
        if not pairs:
            break
        i = min(pairs, key=lambda pair: pair[1])[0]
        merged[i : i + 2] = [IdRange(merged[i].day, merged[i].low, merged[i + 1].high)]
    return merged


def ranges_of(ids: Iterable[str], days: Iterable[str | date]) -> list[IdRange]:
    """The id ranges of rows (their event ids and days, as written: ISO text or dates):
    per day and per first eight characters of the id (a UUIDv7's time, about 65 s), merged
    by :func:`id_ranges` (pure)."""
    buckets: dict[tuple[date, str], tuple[str, str]] = {}
    for event_id, day in zip(ids, days, strict=True):
        key = (day if isinstance(day, date) else date.fromisoformat(day), event_id[:8])
        low, high = buckets.get(key, (event_id, event_id))
        buckets[key] = (min(low, event_id), max(high, event_id))
    return id_ranges(IdRange(day, low, high) for (day, _), (low, high) in buckets.items())


def _gap(a: IdRange, b: IdRange) -> int:
    return int(b.low[:8], 16) - int(a.high[:8], 16) if _hex8(a.high) and _hex8(b.low) else 0


def _hex8(text: str) -> bool:
    return len(text) >= 8 and all(c in "0123456789abcdef" for c in text[:8])


def within(ranges: Iterable[IdRange]) -> Column | None:
    """A filter on ``event_date`` and ``event_id`` that only rows in ``ranges`` pass (None:
    no range, nothing to read)."""
    from pyspark.sql import functions as f

    condition = None
    for item in ranges:
        part = (
            (f.col("event_date") == f.lit(item.day))
            & (f.col("event_id") >= f.lit(item.low))
            & (f.col("event_id") <= f.lit(item.high))
        )
        condition = part if condition is None else condition | part
    return condition


def files_within(table: DeltaTable, ranges: list[IdRange]) -> list[str]:
    """The table's data files that may hold an id of ``ranges``, by their day (partition)
    and their ``event_id`` statistics (a file without statistics may hold any)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    actions = pa.table(table.get_add_actions(flatten=True))
    if actions.num_rows == 0:
        return []
    if "min.event_id" not in actions.column_names or "max.event_id" not in actions.column_names:
        # no file has statistics on event_id (a table written without them): every file
        # of the batch's days may hold one
        days = pa.array(sorted({item.day for item in ranges}), pa.date32())
        keep_all = pc.is_in(actions.column("partition.event_date"), value_set=days)
        return [str(path) for path in actions.filter(keep_all).column("path").to_pylist()]
    low, high = actions.column("min.event_id"), actions.column("max.event_id")
    unknown = pc.or_(pc.is_null(low), pc.is_null(high))
    day = actions.column("partition.event_date")
    keep = None
    for item in ranges:
        meets = pc.and_(
            pc.equal(day, pa.scalar(item.day, pa.date32())),
            pc.or_kleene(
                unknown,
                pc.and_(pc.less_equal(low, item.high), pc.greater_equal(high, item.low)),
            ),
        )
        keep = meets if keep is None else pc.or_(keep, meets)
    if keep is None:
        return []
    return [str(path) for path in actions.filter(keep).column("path").to_pylist()]


def ids_of(rows: DataFrame) -> list[str]:
    """The event ids of ``rows``, brought to the driver (a batch's worth) for
    :func:`rows_within`."""
    ids: list[str] = rows.select("event_id").toArrow().column("event_id").to_pylist()
    return ids


def rows_within(
    settings: LakeSettings,
    table: DeltaTable,
    uri: str,
    ranges: list[IdRange],
    columns: list[str],
    ids: Collection[str] | None = None,
) -> Any:
    """The table's rows whose event id is in ``ranges`` (an Arrow table of ``columns``),
    read on the driver from the few files that may hold one; with ``ids``, only the rows of
    those ids: the ``event_id`` column is read first and the others only from the files
    that hold one of them. File statistics cannot prune a batch whose ranges span a long
    backlog (a catch-up over many partitions: each file then holds ids of every hour), so
    the lookup of a batch's own ids reads one column, not every landed row whole."""
    import pyarrow as pa
    import pyarrow.dataset as ds
    from deltalake.fs import DeltaStorageHandler
    from pyarrow.fs import PyFileSystem

    paths = files_within(table, ranges)
    schema = pa.schema(table.schema().to_arrow())
    wanted = pa.schema([schema.field(name) for name in columns if name != "event_date"])
    if not paths or (ids is not None and not ids):
        return wanted.empty_table()
    filesystem = PyFileSystem(DeltaStorageHandler(uri, storage_options(settings)))
    condition = None
    for item in ranges:
        part = (ds.field("event_id") >= item.low) & (ds.field("event_id") <= item.high)
        condition = part if condition is None else condition | part
    if ids is None:
        dataset = ds.dataset(paths, schema=wanted, format="parquet", filesystem=filesystem)
        return dataset.to_table(filter=condition)
    assert condition is not None  # files were found within the ranges
    mine = condition & ds.field("event_id").isin(pa.array(list(ids), pa.string()))
    keys = ds.dataset(
        paths, schema=pa.schema([schema.field("event_id")]), format="parquet", filesystem=filesystem
    )
    found = keys.to_table(columns=["event_id", "__filename"], filter=mine)
    if wanted.names == ["event_id"]:
        return found.select(["event_id"]).cast(wanted)
    if found.num_rows == 0:
        return wanted.empty_table()
    holding = sorted(set(found.column("__filename").to_pylist()))
    dataset = ds.dataset(holding, schema=wanted, format="parquet", filesystem=filesystem)
    landed = found.column("event_id").combine_chunks()
    return dataset.to_table(filter=ds.field("event_id").isin(landed))


def append_absent(
    settings: LakeSettings, uri: str, rows: DataFrame, key: str, columns: list[str]
) -> int:
    """Append the ``rows`` (few: quarantine rows) whose ``key`` the table at ``uri`` lacks;
    how many. The keys are looked up on the driver (``deltalake``), not by a Spark scan of
    the table: a scan inside the write would make it a reading transaction, which conflicts
    with the other query's appends and with a compaction."""
    import pyarrow.dataset as ds
    from pyspark.sql import functions as f

    rows = rows.persist()
    try:
        keys = [row[key] for row in rows.select(key).distinct().collect()]
        if not keys:
            return 0
        table = open_table(settings, uri)
        known: set[str] = set()
        if table is not None:
            found = table.to_pyarrow_dataset().to_table(
                columns=[key], filter=ds.field(key).isin(keys)
            )
            known = {str(value) for value in found.column(0).to_pylist()}
        new = rows.where(~f.col(key).isin(sorted(known))) if known else rows
        append(new.withColumn("ingest_time", f.current_timestamp()).select(*columns), uri)
        return len(set(keys) - known)
    finally:
        rows.unpersist()


def append(rows: DataFrame, uri: str, options: Mapping[str, str] | None = None) -> None:
    """One Delta commit adding ``rows`` to the table at ``uri`` (empty: a commit all the
    same, which carries ``options`` such as ``userMetadata``)."""
    writer = rows.write.format("delta").mode("append")
    for name, value in (options or {}).items():
        writer = writer.option(name, value)
    writer.save(uri)


class PendingAppend:
    """An append in two steps, as Delta's own streaming sink makes it: the rows' files are
    written first (nothing is visible: the table's log does not name them), then either
    committed in one Delta commit or discarded. Between the two the caller may look at what
    was written and decide. Delta's transaction API (``OptimisticTransaction``: the one its
    writers use) through Spark's JVM; the table's one writer is this job (an append never
    conflicts with a compaction)."""

    def __init__(self, spark: SparkSession, uri: str) -> None:
        jvm: Any = spark._jvm
        self._spark = spark
        self._uri = uri
        delta_log = jvm.org.apache.spark.sql.delta.DeltaLog.forTable(spark._jsparkSession, uri)
        self._transaction = delta_log.startTransaction()
        self._files: Any = None
        self.paths: list[str] = []
        """The written files, relative to the table's root (as its log names them)."""
        self.partition_values: list[dict[str, str]] = []

    def fits(self, schema: StructType) -> bool:
        """Whether rows of ``schema`` have the table's columns, each of its type (Delta's
        writers check this before they write; its transaction API does not)."""
        import json

        from pyspark.sql.types import StructType

        table = StructType.fromJson(json.loads(self._transaction.metadata().schema().json()))
        types = {field.name: field.dataType for field in table.fields}
        return len(schema.fields) == len(types) and all(
            types.get(field.name) == field.dataType for field in schema.fields
        )

    def write(self, rows: DataFrame) -> None:
        """Write the files of ``rows`` (one Spark job), not yet committed."""
        files = self._transaction.writeFiles(rows._jdf)
        self._files = files
        for index in range(files.size()):
            action = files.apply(index)
            self.paths.append(str(action.path()))
            values = action.partitionValues()
            keys = values.keys().toList()
            self.partition_values.append(
                {str(keys.apply(i)): str(values.apply(keys.apply(i))) for i in range(keys.size())}
            )

    def commit(self, user_metadata: str | None = None) -> int:
        """One Delta commit naming the written files, with ``user_metadata``; its version.
        Once called, the files are the table's whatever it raises (the commit may have
        landed): never discard them after."""
        jvm: Any = self._spark._jvm
        none = jvm.scala.Option.empty()
        operation = jvm.org.apache.spark.sql.delta.DeltaOperations.Write(
            jvm.org.apache.spark.sql.SaveMode.Append,
            none,
            none,
            none if user_metadata is None else jvm.scala.Some(user_metadata),
            none,
            none,
            none,
            none,
            none,
        )
        files = self._files if self._files is not None else jvm.scala.collection.immutable.Nil
        return int(self._transaction.commit(files, operation))

    def discard(self) -> None:
        """Delete the written files (never committed: no reader knows them). One that
        cannot be deleted is left to ``outbox lake maintain`` (its vacuum removes files
        the log does not name)."""
        jvm: Any = self._spark._jvm
        hadoop = self._spark.sparkContext._jsc.hadoopConfiguration()
        root = jvm.org.apache.hadoop.fs.Path(self._uri)
        for relative in self.paths:
            try:
                path = jvm.org.apache.hadoop.fs.Path(root, relative)
                path.getFileSystem(hadoop).delete(path, False)
            except Exception as error:  # py4j's errors: left for the vacuum
                log.warning("an uncommitted file of %s not deleted: %s", self._uri, error)
        self.paths = []
        self._files = None

    def read(self, settings: LakeSettings, columns: list[str]) -> Any:
        """The written rows' ``columns`` (an Arrow table; a partition column from each
        file's partition values), read on the driver."""
        import pyarrow as pa
        import pyarrow.parquet as pq
        from deltalake.fs import DeltaStorageHandler
        from pyarrow.fs import PyFileSystem

        filesystem = PyFileSystem(DeltaStorageHandler(self._uri, storage_options(settings)))
        tables = []
        for relative, values in zip(self.paths, self.partition_values, strict=True):
            stored = [name for name in columns if name not in values]
            table = pq.read_table(_unquoted(relative), columns=stored, filesystem=filesystem)
            for name in columns:
                if name in values:
                    table = table.append_column(name, pa.array([values[name]] * table.num_rows))
            tables.append(table.select(columns))
        return pa.concat_tables(tables) if tables else None


def _unquoted(relative: str) -> str:
    """A path of the Delta log (URI-encoded) as a file name."""
    from urllib.parse import unquote

    return unquote(relative)


def create_table(
    settings: LakeSettings, uri: str, schema: Any, *, by_day: bool, owner: str | None
) -> None:
    """Create an empty table unless it exists (``deltalake``: reader 1 / writer 2, no table
    feature; on object storage a conditional write of version 0, before Spark's writer ever
    touches the table)."""
    from deltalake import DeltaTable

    if is_table(settings, uri):
        return
    try:
        DeltaTable.create(
            uri,
            schema=schema,
            partition_by=["event_date"] if by_day else None,
            name=owner,
            mode="ignore",
            configuration=dict(TABLE_PROPERTIES),
            storage_options=storage_options(settings),
        )
    except Exception as error:
        if not is_table(settings, uri):
            raise
        log.info("table %s created meanwhile: %s", uri, error)


def table_owner_and_columns(
    table: DeltaTable | None, base: Iterable[str], kinds: Mapping[str, str]
) -> tuple[str | None, dict[str, str]]:
    """(the table's metadata name, its columns beyond ``base``: name → kind, by ``kinds``
    of Delta's type names, ``string`` otherwise); (None, {}) when there is no table yet."""
    if table is None:
        return None, {}
    skip = set(base)
    columns: dict[str, str] = {}
    for column in table.schema().fields:
        if column.name in skip:
            continue
        kind = getattr(column.type, "type", None)
        columns[column.name] = kinds.get(str(kind), "string")
    return table.metadata().name or "", columns
