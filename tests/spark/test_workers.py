"""spark/workers.py: the warm-up starts the Python workers the job's own tasks then use."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pyarrow as pa
from pyspark.sql import SparkSession

from spark import workers


def worker_pid(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    for _ in batches:
        yield pa.RecordBatch.from_pydict({"pid": [os.getpid()]})


def test_the_screens_python_tasks_run_in_the_warmed_up_workers(spark: SparkSession) -> None:
    warmed = workers.start(spark).join()
    slots = spark.sparkContext.defaultParallelism
    assert len(warmed) == slots
    # a task of the same kind as the screen's (mapInArrow), in the same pool of idle workers
    used = spark.range(0, slots, 1, slots).mapInArrow(worker_pid, "pid long").collect()
    assert {row.pid for row in used} <= set(warmed)


def test_a_failed_warm_up_leaves_the_job_to_start_its_own_workers(
    spark: SparkSession,
) -> None:
    failing = spark.sparkContext.parallelize([0], 1).map(lambda n: 1 // n)
    assert workers.WarmUp(failing).join() == []
    assert spark.range(3).count() == 3  # the session goes on
