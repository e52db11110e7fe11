"""Start the audit's SparkSession: loopback only, no web UI, the venv's Python on executors.

Kept apart from audit.py so tests, the benchmark and the CLI start Spark the same way.
"""

from __future__ import annotations

import os
import sys

from pyspark import SparkContext
from pyspark.sql import SparkSession

from spark import jvm_archive

LOOPBACK = "127.0.0.1"
SHUFFLE_PARTITIONS_DEFAULT = 8  # the audit shuffles little: group checks on narrow columns
# local mode: the driver JVM is also the executor. The broker rules' joins and groupings over
# every message grow with the stores: a 30-minute broker soak's (7.3M messages over six replicas)
# ran a 2 GiB heap out of space (session 19), so the default takes a quarter of the machine's
# memory, within these bounds (`dledger-audit --driver-memory` to choose)
DRIVER_MEMORY_MIN_MIB = 2048
DRIVER_MEMORY_MAX_MIB = 16384


def driver_memory_default() -> str:
    """A quarter of physical memory in MiB, within DRIVER_MEMORY_MIN_MIB..MAX_MIB."""
    try:
        total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        total = 0
    mib = total // 4 // (1 << 20)
    return f"{min(max(mib, DRIVER_MEMORY_MIN_MIB), DRIVER_MEMORY_MAX_MIB)}m"


DRIVER_MEMORY_DEFAULT = driver_memory_default()
EXECUTOR_MEMORY_DEFAULT = "1g"  # standalone workers: per executor JVM
# Spark's generated code for the audit's wide rows has methods over HotSpot's 8000-byte JIT
# limit; without this they run interpreted (the row rules' pass took twice as long).
# C1 only: the JVM lives for seconds, and C2 warming up doubled the planning of the one query.
# C1 alone gets a 48 MiB code cache by default, which a JVM that runs many audits fills (the
# tests' shared session did, session 10: "CodeCache is full. Compiler has been disabled", then
# "Out of space in CodeCache for adapters" killed the JVM); 240 MiB is what tiered JVMs get.
# It is address space reserved, committed only as code is compiled.
JVM_OPTIONS = "-XX:-DontCompileHugeMethods -XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=240m"
# Spark sizes its memory pages from the heap (32 MiB for a 2g driver on 2 cores), and every
# task of a hash aggregate or shuffle takes at least one: with ~30 small tasks in the checks,
# G1 spent 2.5-4 s on those humongous allocations. 2 MiB pages cut that to ~0.5 s (the checks
# of a healthy 6M-entry audit ~2 s faster, docs/decisions.md); big inputs just use more pages.
PAGE_SIZE_DEFAULT = "2m"


class SessionInUse(RuntimeError):
    """start() was called while this process already runs a SparkSession."""


def start(
    master: str,
    *,
    app_name: str = "dledger-audit",
    shuffle_partitions: int = SHUFFLE_PARTITIONS_DEFAULT,
    driver_memory: str = DRIVER_MEMORY_DEFAULT,
    extra: dict[str, str] | None = None,
    archive_options: str | None = None,
) -> SparkSession:
    """A new SparkSession bound to 127.0.0.1 with the UI off. The driver maps the JVM class
    archive (spark/jvm_archive.py) if there is one, or takes `archive_options` instead.

    Refuses (SessionInUse) when this process already runs one: getOrCreate would hand that
    one back with none of this configuration, and the caller, thinking it its own, would
    stop it under its real owner."""
    if SparkContext._active_spark_context is not None:
        raise SessionInUse("a SparkSession is already running in this process")
    if archive_options is None:
        archive_options = jvm_archive.use_options(JVM_OPTIONS)
    os.environ.setdefault("SPARK_LOCAL_IP", LOOPBACK)  # the launcher and any UI bind here
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")  # spark/progress.py reports instead
        .config("spark.driver.host", LOOPBACK)
        .config("spark.driver.bindAddress", LOOPBACK)
        .config("spark.driver.memory", driver_memory)
        .config("spark.executor.memory", EXECUTOR_MEMORY_DEFAULT)
        .config("spark.driver.extraJavaOptions", f"{JVM_OPTIONS} {archive_options}".strip())
        .config("spark.executor.extraJavaOptions", JVM_OPTIONS)
        .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
        .config("spark.buffer.pageSize", PAGE_SIZE_DEFAULT)
        .config("spark.sql.adaptive.enabled", "true")
        .config("spark.pyspark.python", sys.executable)
        .config("spark.python.worker.reuse", "true")
        # the daemon that forks Python workers, importing pyspark's bytecode, not its source zip
        .config("spark.python.daemon.module", "spark.executor_daemon")
        .config("spark.sql.session.timeZone", "UTC")
        # PySpark 4 otherwise records the Python call site of every Column function, with
        # three or four extra JVM round trips each: building the rule set's query took seconds
        .config("spark.python.sql.dataFrameDebugging.enabled", "false")
    )
    for key, value in (extra or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark
