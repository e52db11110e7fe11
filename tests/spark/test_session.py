"""Who owns the SparkSession: an audit started in a process that already runs one (a notebook,
this test run) must neither borrow it nor stop it. A CI run once lost ten tests this way: a
CLI test's audit, refusing a bad history after starting "its own" session, was handed the
run's shared one by getOrCreate and stopped it."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from spark import audit, session
from tests.spark import stores

pytestmark = pytest.mark.spark


def test_start_refuses_while_a_session_runs(spark: SparkSession) -> None:
    with pytest.raises(session.SessionInUse):
        session.start("local[1]")
    assert spark.range(3).count() == 3


def test_an_audit_refusing_its_history_leaves_the_running_session_alone(
    spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    stores.write_replica(tmp_path / "s", "g", "n0", [b"x"], commit_index=1)
    history = tmp_path / "history.jsonl"
    history.write_text('{"type": "invoke"}\nnot json\n')
    argv = ["--stores", str(tmp_path / "s"), "--out", str(tmp_path / "o"),
            "--history", str(history), "--quiet"]  # fmt: skip
    assert audit.main(argv) == 2
    assert f"{history}: line 2: not JSON" in capsys.readouterr().err
    assert spark.range(3).count() == 3  # still running: the audit did not stop it
