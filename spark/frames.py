"""DataFrames of rows the driver already holds (replica facts, spans, bucket summaries, a
chaos history), built as Spark LocalRelations.

`spark.createDataFrame(list)` ships the rows as an RDD of pickles: a plan node with no size and
no row count, so Spark plans shuffles and sort-merge joins around a few hundred rows and
cannot see that an empty input makes a join empty until a job has run. From an Arrow table,
Spark 4 builds a LocalRelation instead: joins with it are broadcast, and an empty one prunes
what joins with it while the query is planned. In the audit of a healthy store that cut the
checks' stages from ~50 to a handful (docs/decisions.md).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema
from pyspark.sql.types import DataType, StructType


def struct(schema: StructType | str) -> StructType:
    """A StructType, from itself or from a DDL string ("group string, index long")."""
    if isinstance(schema, StructType):
        return schema
    parsed = DataType.fromDDL(schema)
    if not isinstance(parsed, StructType):
        raise TypeError(f"not a row schema: {schema!r}")
    return parsed


def local(
    spark: SparkSession,
    rows: Sequence[Sequence[Any]] | Sequence[Mapping[str, Any]],
    schema: StructType | str,
) -> DataFrame:
    """`rows` (tuples in schema order, or dicts by column name) as a LocalRelation."""
    fields = struct(schema)
    arrow = to_arrow_schema(fields)
    if rows and isinstance(rows[0], Mapping):
        table = pa.Table.from_pylist(list(rows), schema=arrow)
    else:
        table = pa.Table.from_arrays(_columns(rows, arrow), schema=arrow)
    return spark.createDataFrame(table, fields)


def _columns(rows: Sequence[Any], schema: pa.Schema) -> list[pa.Array]:
    """Rows of tuples in `schema` order as one Arrow array per field."""
    columns = list(zip(*rows, strict=True)) if rows else [() for _ in schema]
    return [pa.array(column, type=f.type) for column, f in zip(columns, schema, strict=True)]


def empty(spark: SparkSession, schema: pa.Schema) -> DataFrame:
    """No rows of an Arrow schema, as an empty LocalRelation."""
    return spark.createDataFrame(schema.empty_table())


def map_tasks(
    spark: SparkSession,
    rows: Sequence[Sequence[Any]],
    schema: pa.Schema,
    body: Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]],
    out_schema: pa.Schema,
    *,
    packs: Sequence[Sequence[int]] | None = None,
) -> DataFrame:
    """`body` as a mapInArrow over the task `rows` (tuples in `schema` order): one Spark task
    per row, or with `packs`, one per pack (the numbers of the rows it runs, in order). A range
    of one id per partition, each id turned back into its rows in the task.

    The rows travel inside the pickled function, which Spark ships once per stage. A join of
    the range with the rows as a broadcast LocalRelation cost a broadcast job and ~0.5 s more
    planning on a cold JVM; parallelize() ran a Python worker per task to pickle its row
    first (the audit's first job started ~1.5 s later that way)."""
    packs = [[k] for k in range(len(rows))] if packs is None else packs
    ids = spark.range(0, len(packs), 1, max(1, len(packs)))
    packed = [[tuple(rows[k]) for k in pack] for pack in packs]
    return ids.mapInArrow(
        functools.partial(_run_on_rows, packed, schema, body), from_arrow_schema(out_schema)
    )


def _run_on_rows(
    packs: list[list[tuple[Any, ...]]],
    schema: pa.Schema,
    body: Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]],
    batches: Iterator[pa.RecordBatch],
) -> Iterator[pa.RecordBatch]:
    """Executor side of map_tasks: the task's ids as batches of their rows, through `body`."""

    def picked() -> Iterator[pa.RecordBatch]:
        for batch in batches:
            chosen = [row for i in batch.column(0).to_pylist() for row in packs[i]]
            yield pa.RecordBatch.from_arrays(_columns(chosen, schema), schema=schema)

    yield from body(picked())
