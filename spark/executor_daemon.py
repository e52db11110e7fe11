"""PySpark's Python worker daemon, run with the installed pyspark ahead of Spark's source zips.

Spark puts SPARK_HOME/python/lib/pyspark.zip and py4j's zip first on the PYTHONPATH of the
daemon that forks every Python worker. The zips hold sources only, so each daemon compiles all
of pyspark it imports, and each worker compiles pyspark.sql, again: 1.35 s for the daemon's own
imports here against 0.2 s from the installed package's bytecode, on the critical path of the
audit's first task. With a pip-installed Spark, SPARK_HOME is the installed pyspark package, and
its zips hold the same code as the package: this module then moves them to the end of sys.path
before PySpark's daemon starts. Zips of any other Spark home stay where Spark put them.

session.start names it as spark.python.daemon.module. It imports nothing that starts threads
(the daemon forks its workers).
"""

from __future__ import annotations

import importlib.machinery
import os
import sys


def installed_package_dir(name: str, path: list[str]) -> str | None:
    """Where package `name` is installed among the non-zip entries of `path`, if it is."""
    plain = [entry for entry in path if not entry.endswith(".zip")]
    spec = importlib.machinery.PathFinder.find_spec(name, plain)
    if spec is None or not spec.submodule_search_locations:
        return None
    return os.path.realpath(next(iter(spec.submodule_search_locations)))


def prefer_installed(path: list[str]) -> list[str]:
    """`path` with the zips of the installed pyspark's own python/lib moved to its end, when
    pyspark and py4j are both installed (their bytecode is then found first)."""
    pyspark = installed_package_dir("pyspark", path)
    if pyspark is None or installed_package_dir("py4j", path) is None:
        return path
    own_lib = os.path.join(pyspark, "python", "lib")

    def own(entry: str) -> bool:
        return entry.endswith(".zip") and os.path.dirname(os.path.realpath(entry)) == own_lib

    return [e for e in path if not own(e)] + [e for e in path if own(e)]


def main() -> None:
    sys.path[:] = prefer_installed(sys.path)
    from pyspark import daemon

    daemon.manager()


if __name__ == "__main__":
    main()
