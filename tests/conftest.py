"""Fixtures more than one test folder uses: the JVM class archive every dledger-audit run of
the tests maps, and the one SparkSession of the run (tests/spark, and the broker chaos run's
audit of its stores): a JVM costs seconds and hundreds of MiB."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import pytest
from pyspark.sql import SparkSession

from dledger.processes import kill_spawned_on_sigterm
from spark import jvm_archive, session


def pytest_configure(config: pytest.Config) -> None:
    # a run stopped by SIGTERM (a CI timeout, a kill) runs no fixture teardown: the clusters
    # the tests started would outlive it
    kill_spawned_on_sigterm()


@pytest.fixture(scope="session")
def archive(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The archive's path, in a cache of this run that DLEDGER_AUDIT_CACHE names meanwhile:
    made once per run by dledger-audit-prepare, which proves the command and saves more than it
    costs (a JVM start maps it)."""
    cache = tmp_path_factory.mktemp("jvm-archive")
    result = subprocess.run(
        [sys.executable, "-m", "spark.prepare", "--cache", str(cache)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    with mock.patch.dict(os.environ, {jvm_archive.CACHE_ENV: str(cache)}):
        yield jvm_archive.archive_path(session.JVM_OPTIONS)


@pytest.fixture(scope="session")
def spark(archive: Path) -> Iterator[SparkSession]:
    """Its driver maps the run's JVM class archive, as every dledger-audit process the tests
    start does."""
    s = session.start("local[2]", app_name="dledger-audit-tests", shuffle_partitions=4)
    yield s
    s.stop()
