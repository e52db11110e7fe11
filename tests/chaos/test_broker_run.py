"""A real broker chaos run through the command line: 2 name servers and 2 broker groups x 3
`dledger-broker` replicas, each process in a network namespace of its own, our producers and
consumers through a leader kill and a partition of a leader; every check must hold and the run
must leave nothing behind, and dledger-audit must find the stores it keeps consistent with its
history (every acknowledged message stored once, every consumed one stored)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from spark import audit
from tests.chaos.test_run import CLI, REPO, leftovers, needs_root

RUN_TIMEOUT_S = 300.0  # the 60 s run takes ~80 s on a quiet machine (start, drain, final read)


@needs_root
@pytest.mark.chaos
@pytest.mark.spark
def test_a_short_broker_run_with_a_leader_kill_and_a_partition_passes(
    tmp_path: Path, spark: SparkSession
) -> None:
    out = tmp_path / "broker-mixed"
    p = subprocess.Popen(
        [
            *CLI,
            "run",
            "--target",
            "broker",
            "--scenario",
            "mixed",
            "--duration",
            "60",
            "--seed",
            "7",
            "--out",
            str(out),
            "--keep-stores",
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        stdout, stderr = p.communicate(timeout=RUN_TIMEOUT_S)
    finally:
        p.kill()
    report = json.loads((out / "report.json").read_text())
    assert p.returncode == 0, f"{stdout}\n{stderr[-3000:]}\n{report['reasons']}"
    assert report["verdict"] == "pass" and "verdict PASS" in stdout
    assert {"kill-leader", "partition-leader"} <= set(report["faults"])
    assert report["acked"] > 0 and report["acked_lost"] == 0 and report["acked_misplaced"] == 0
    assert set(report["acked_unconsumed"].values()) == {0}
    assert report["order_violations"] == 0 and report["keys_checked"] > 0
    assert report["queue_problems"] == 0 and report["rewinds_beyond_bound"] == 0
    assert report["process_crashes"] == 0 and report["final_read"] is True
    for group in ("broker-a", "broker-b"):
        facts = report["groups"][group]
        assert facts["acked"] > 0 and facts["lost"] == 0, (group, facts)
        assert facts["longest_no_ok_ms"] is not None  # reported, not asserted: shared machine
    assert report["failover_ms"]["count"] >= 2
    assert leftovers(out) == []
    for name in ("history.jsonl", "final.json", "report.md", "timeline.png", "harness.log"):
        assert (out / name).exists(), name
    assert (out / "logs" / "broker-a-n0.log").exists() and (out / "logs" / "namesrv-1.log").exists()
    rejudged = subprocess.run([*CLI, "check", str(out)], cwd=REPO, capture_output=True, text=True)
    assert rejudged.returncode == 0, rejudged.stderr
    assert json.loads((out / "report.json").read_text())["acked"] == report["acked"]

    # in this process's SparkSession (the same audit as `dledger-audit`, whose command line
    # tests/spark/test_audit_e2e.py runs): a JVM of its own would cost half a minute more
    code = audit.main(
        ["--stores", str(out / "stores"), "--out", str(out / "audit"),
         "--history", str(out / "history.jsonl"), "--quiet"],
        spark=spark,
    )  # fmt: skip
    report_file = out / "audit" / "report.json"  # absent when the audit could not run
    assert code == 0, report_file.read_text() if report_file.exists() else f"exit {code}"
    verdict = json.loads(report_file.read_text())
    assert verdict["verdict"] == "consistent", verdict
    assert {r["group"] for r in verdict["replicas"]} == {"broker-a", "broker-b"}
