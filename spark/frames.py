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

from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
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
        columns = list(zip(*rows, strict=True)) if rows else [() for _ in arrow]
        table = pa.Table.from_arrays(
            [pa.array(column, type=f.type) for column, f in zip(columns, arrow, strict=True)],
            schema=arrow,
        )
    return spark.createDataFrame(table, fields)


def empty(spark: SparkSession, schema: pa.Schema) -> DataFrame:
    """No rows of an Arrow schema, as an empty LocalRelation."""
    return spark.createDataFrame(schema.empty_table())


TASK_ID = "_task"  # the column tasks() joins on; dropped again


def tasks(spark: SparkSession, rows: Sequence[Sequence[Any]], schema: pa.Schema) -> DataFrame:
    """One row per partition: the task rows a mapInArrow body runs, one Spark task each. Built in
    the JVM, a range of one row per partition joined with the rows as a broadcast LocalRelation;
    parallelize() would first run a Python worker per task to pickle its row (the audit's first
    job started ~1.5 s later that way)."""
    fields = from_arrow_schema(pa.schema([pa.field(TASK_ID, pa.int64()), *schema]))
    table = local(spark, [(i, *row) for i, row in enumerate(rows)], fields)
    ids = spark.range(0, len(rows), 1, max(1, len(rows))).withColumnRenamed("id", TASK_ID)
    return ids.join(F.broadcast(table), TASK_ID).drop(TASK_ID)
