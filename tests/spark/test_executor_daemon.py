"""The Python worker daemon prefers the installed pyspark's bytecode to Spark's source zips, and
only when those zips are the installed package's own (spark/executor_daemon.py)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from pyspark.sql import SparkSession

from spark import executor_daemon


def installed(site: Path, *, py4j: bool = True) -> tuple[str, str]:
    """A site directory holding pyspark (with python/lib zips, as pip installs it) and py4j."""
    lib = site / "pyspark" / "python" / "lib"
    lib.mkdir(parents=True)
    (site / "pyspark" / "__init__.py").write_text("")
    if py4j:
        (site / "py4j").mkdir()
        (site / "py4j" / "__init__.py").write_text("")
    for name in ("pyspark.zip", "py4j-src.zip"):
        (lib / name).write_bytes(b"")
    return str(lib / "pyspark.zip"), str(lib / "py4j-src.zip")


def test_the_installed_packages_own_zips_go_to_the_end(tmp_path: Path) -> None:
    zip_pyspark, zip_py4j = installed(tmp_path / "site")
    path = [zip_pyspark, zip_py4j, "/elsewhere", str(tmp_path / "site")]
    assert executor_daemon.prefer_installed(path) == [
        "/elsewhere",
        str(tmp_path / "site"),
        zip_pyspark,
        zip_py4j,
    ]


def test_zips_of_another_spark_home_stay_first(tmp_path: Path) -> None:
    installed(tmp_path / "site")
    other = tmp_path / "spark-home" / "python" / "lib"
    other.mkdir(parents=True)
    path = [str(other / "pyspark.zip"), str(other / "py4j-src.zip"), str(tmp_path / "site")]
    assert executor_daemon.prefer_installed(path) == path


def test_nothing_moves_without_an_installed_py4j_or_pyspark(tmp_path: Path) -> None:
    zips = list(installed(tmp_path / "site", py4j=False))
    path = [*zips, str(tmp_path / "site")]
    assert executor_daemon.prefer_installed(path) == path
    path = [*zips, str(tmp_path / "empty")]
    assert executor_daemon.prefer_installed(path) == path


def _where_pyspark_comes_from(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    import pyspark

    for _ in batches:
        yield pa.RecordBatch.from_pydict({"file": [pyspark.__file__], "pid": [os.getpid()]})


@pytest.mark.spark
def test_python_workers_run_pyspark_from_its_installed_bytecode(spark: SparkSession) -> None:
    assert spark.conf.get("spark.python.daemon.module") == "spark.executor_daemon"
    rows = (
        spark.range(2, numPartitions=2)
        .mapInArrow(_where_pyspark_comes_from, "file string, pid long")
        .collect()
    )
    assert rows and all(".zip" not in row.file for row in rows), rows
    assert all(row.pid != os.getpid() for row in rows)  # a worker, not this driver
