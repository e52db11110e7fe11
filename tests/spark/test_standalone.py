"""The audit on a Spark standalone master with 2 workers started by spark/standalone.py.

Slow (three JVMs plus executors): marked `slow`, run with `pytest -m "spark and slow"`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from spark import standalone
from tests.spark.stores import write_group

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def listening(pid: int) -> list[str]:
    """Local addresses `pid` listens on, from ss."""
    out = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, check=True).stdout
    return [line.split()[3] for line in out.splitlines() if f"pid={pid}," in line]


def test_audit_on_a_standalone_cluster(tmp_path: Path) -> None:
    write_group(tmp_path / "stores", "g", 40)
    cluster = tmp_path / "cluster"
    url = standalone.start(cluster, workers=2)
    pids = [int(p.read_text()) for p in cluster.glob("*.pid")]
    try:
        assert len(pids) == 3
        for pid in pids:
            addresses = listening(pid)
            hosts = [a.rsplit(":", 1)[0].strip("[]") for a in addresses]
            assert hosts and all(h in ("127.0.0.1", "::ffff:127.0.0.1") for h in hosts), addresses
        out = tmp_path / "out"
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "spark.audit",
                "--stores",
                str(tmp_path / "stores"),
                "--out",
                str(out),
                "--master",
                url,
                "--quiet",
            ],
            capture_output=True,
            text=True,
            timeout=600,
            cwd=Path(__file__).parents[2],
        )
        assert result.returncode == 0, result.stderr[-3000:]
        report = json.loads((out / "report.json").read_text())
        assert report["verdict"] == "consistent" and report["entries_checked"] == 120
        assert report["master"] == url
    finally:
        stopped = standalone.stop(cluster)
    assert sorted(stopped) == sorted(pids)
    for pid in pids:
        assert not os.path.exists(f"/proc/{pid}") or standalone._state(pid) == "Z", pid
    assert not list(cluster.glob("*.pid"))
