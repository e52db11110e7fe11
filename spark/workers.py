"""Start the executors' Python workers while the driver is still planning the screen.

A Python worker's first task pays for the daemon's start, the fork and the worker's imports
(pyarrow, pandas, numpy, this package): ~1.2 s here, on the critical path of the audit's first
tasks, while in the ~1.4 s before them the driver is planning the screen's query on one core and
the second core is idle. `start` runs a tiny job in a thread of the driver, one task per task
slot, that starts the workers and imports what the screen's tasks import; with worker reuse on
(session.start) the screen's tasks then run in those same workers.

Spark keys its pool of idle workers by the Python function's environment, and the SQL runners
(mapInArrow) add SPARK_SIMPLIFIED_TRACEBACK=1 to it: the warm-up's plain Python job sets the same
variable, or its workers would be a pool of their own that the screen never uses. The warm-up
only saves time: when it fails or its workers are not reused, the screen starts its own.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable

from pyspark import RDD
from pyspark.sql import SparkSession

# what PySpark's SQL runners put in every Python function's environment (pyspark.util reads it)
SQL_WORKER_ENV = {"SPARK_SIMPLIFIED_TRACEBACK": "1"}


def _import_task_modules(_: Iterable[int]) -> Iterable[int]:
    """The warm-up task: import what a screening task imports, report the worker's pid."""
    import pyarrow  # noqa: F401
    import pyspark.sql.pandas.serializers  # mapInArrow's serializer; imports pandas
    import pyspark.worker  # noqa: F401

    import spark.screen  # noqa: F401

    return [os.getpid()]


class WarmUp:
    """A warm-up job collected in a driver thread. `join` waits for it and returns what it
    collected, the pids of the workers it used (empty when it failed: the job's own tasks then
    start workers as they would have without it)."""

    def __init__(self, job: RDD[int]) -> None:
        self._job = job
        self._pids: list[int] = []
        self._thread = threading.Thread(target=self._run, name="python-workers-warm-up")
        self._thread.start()

    def _run(self) -> None:
        try:
            self._pids = self._job.collect()
        except Exception:  # a warm-up: the real job reports its own failures
            self._pids = []

    def join(self) -> list[int]:
        self._thread.join()
        return self._pids


def start(spark: SparkSession) -> WarmUp:
    """Start the executors' Python workers in the background (see the module docstring): one
    task per task slot, in the pool of workers the SQL runners take theirs from."""
    sc = spark.sparkContext
    for key, value in SQL_WORKER_ENV.items():
        sc.environment.setdefault(key, value)
    slots = sc.defaultParallelism
    return WarmUp(sc.parallelize(range(slots), slots).mapPartitions(_import_task_modules))
