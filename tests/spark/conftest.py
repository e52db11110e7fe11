"""One SparkSession for the whole tests/spark run: a JVM costs seconds and hundreds of MiB. Its
driver, and every dledger-audit process the tests start, maps the run's JVM class archive
(tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from spark import session


@pytest.fixture(scope="session")
def spark(archive: Path) -> Iterator[SparkSession]:
    s = session.start("local[1]", app_name="dledger-audit-tests", shuffle_partitions=4)
    yield s
    s.stop()
