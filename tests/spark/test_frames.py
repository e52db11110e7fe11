"""Driver-held rows become LocalRelations (spark/frames.py): the job's planning relies on it."""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
import pytest
from pyspark.sql import DataFrame, SparkSession

from spark import frames, read, screen

pytestmark = pytest.mark.spark


def optimized(df: DataFrame) -> str:
    return str(df._jdf.queryExecution().optimizedPlan().getClass().getSimpleName())


def test_tuples_and_dicts_arrive_as_rows_of_a_local_relation(spark: SparkSession) -> None:
    rows = [("g", "n0", 3, 1, 3, 300), ("g", "n1", 0, None, None, 0)]
    df = frames.local(spark, rows, screen.SPANS_SCHEMA)
    assert optimized(df) == "LocalRelation"
    assert [tuple(r) for r in df.collect()] == rows
    assert df.schema == frames.struct(screen.SPANS_SCHEMA)
    named = [dict(zip(df.columns, r, strict=True)) for r in rows]
    assert [tuple(r) for r in frames.local(spark, named, screen.SPANS_SCHEMA).collect()] == rows


def test_an_empty_frame_is_pruned_while_planning(spark: SparkSession) -> None:
    entries = frames.empty(spark, read.ENTRY_SCHEMA)
    facts = frames.local(spark, [], "group string, commit_index long")
    assert entries.count() == 0 and facts.columns == ["group", "commit_index"]
    joined = entries.join(facts, "group").groupBy("group").count()
    assert optimized(joined) == "LocalRelation"  # no job needed to learn it is empty


def test_rows_that_do_not_fit_the_schema_are_refused(spark: SparkSession) -> None:
    with pytest.raises((TypeError, ValueError)):
        frames.local(spark, [("g", "not a number")], "group string, n long")
    with pytest.raises(TypeError, match="not a row schema"):
        frames.struct("long")


def test_map_tasks_runs_the_body_once_per_row_in_a_task_of_its_own(spark: SparkSession) -> None:
    echoed = read.TASK_SCHEMA.append(pa.field("rows_in_task", pa.int64()))

    def echo_task_rows(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            rows = [{**row, "rows_in_task": batch.num_rows} for row in batch.to_pylist()]
            yield pa.RecordBatch.from_pylist(rows, schema=echoed)

    rows = [("g", "n0", 1, 100), ("g", "n1", 1, 100), ("h", "n0", 5, 9)]
    df = frames.map_tasks(spark, rows, read.TASK_SCHEMA, echo_task_rows, echoed)
    assert df.rdd.getNumPartitions() == len(rows)
    got = sorted(tuple(r) for r in df.collect())
    assert got == sorted((*row, 1) for row in rows)  # each task saw exactly its own row
    plan = df._jdf.queryExecution().executedPlan().toString()
    assert "Exchange" not in plan and "Join" not in plan  # no shuffle, no broadcast job
    empty = frames.map_tasks(spark, [], read.TASK_SCHEMA, echo_task_rows, echoed)
    assert empty.count() == 0
