"""report.json keeps its keys; report.md and timeline.png are written; `check` re-judges a
saved run exactly."""

from __future__ import annotations

import json
from pathlib import Path

from chaos import checks, final, report
from chaos.cli import main
from chaos.history import write_history
from tests.chaos.histories import Builder, agreeing

# Scripts and CI read these; renaming one breaks them. Add keys at the end, never rename.
STABLE_KEYS = [
    "verdict",
    "reasons",
    "acked",
    "acked_lost",
    "acked_misplaced",
    "order_violations",
    "replicas_agree",
    "failed_in_log",
    "unexpected_in_log",
    "replica_crashes",
    "duplicates",
    "unknown_in_log",
    "ops",
    "failover_ms",
    "failover_ms_by_kind",
    "faults",
    "longest_no_ok_ms",
    "final_read",
    "uncommitted",
    "details",
    "run",
]


def a_run() -> Builder:
    kill = {"fault": "kill-leader", "leader": "n0", "leader_affected": True, "nodes": ["n0"]}
    b = Builder().at(0).append(0, "0-0", index=2, node="n0")
    b.at(100).fault("kill", kill).at(300).append(1, "1-0", index=3, node="n1")
    b.at(2000).fault("kill", {**kill, "restarted": ["n0"]}, "ok")
    b.fault("recover", {"fault": "kill-leader"}).fault(
        "recover", {"fault": "kill-leader", "ms": 5}, "ok"
    )
    return b.append(0, "0-1", index=4, node="n1")


def test_report_json_keys_are_stable(tmp_path: Path) -> None:
    history = a_run().ops
    evaluation = checks.evaluate(history, agreeing([None, "0-0", "1-0", "0-1"]))
    written = report.write(tmp_path, history, evaluation, {"scenario": "leader-kill", "seed": 7})
    assert list(report.REPORT_KEYS) == STABLE_KEYS
    on_disk = json.loads((tmp_path / report.REPORT_JSON).read_text())
    assert list(on_disk) == STABLE_KEYS == list(written)
    assert on_disk["verdict"] == "pass"
    assert set(on_disk["failover_ms"]) == {"p50", "p99", "max", "count"}
    assert on_disk["failover_ms"]["p50"] == 201.0
    assert on_disk["faults"] == {"kill-leader": 1}
    assert (on_disk["acked_lost"], on_disk["order_violations"], on_disk["replicas_agree"]) == (
        0,
        0,
        True,
    )
    md = (tmp_path / report.REPORT_MD).read_text()
    assert "**Verdict: PASS**" in md and "| 1 | kill-leader |" in md
    assert (tmp_path / report.TIMELINE_PNG).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_without_a_final_read_the_value_checks_are_null(tmp_path: Path) -> None:
    history = a_run().ops
    evaluation = checks.evaluate(history, final.NO_FINAL_READ)
    written = report.build(history, evaluation, {})
    assert written["verdict"] == "unknown"
    assert written["acked_lost"] is None and written["order_violations"] is None
    assert written["final_read"] is False


def test_check_rejudges_a_saved_run(tmp_path: Path) -> None:
    history = a_run().append(1, "1-1", index=5).ops  # acknowledged, and then lost
    write_history(tmp_path / "history.jsonl", history)
    final.save(tmp_path / final.FINAL_FILE, agreeing([None, "0-0", "1-0", "0-1"]))
    assert main(["check", str(tmp_path)]) == 1
    saved = json.loads((tmp_path / report.REPORT_JSON).read_text())
    assert saved["verdict"] == "fail" and saved["acked_lost"] == 1
    assert saved["details"]["lost"][0]["value"] == "1-1"
    (tmp_path / final.FINAL_FILE).unlink()  # as if the run never read the replicas back
    assert main(["check", str(tmp_path)]) == 1
    assert json.loads((tmp_path / report.REPORT_JSON).read_text())["verdict"] == "unknown"


def test_check_of_a_directory_without_a_history_is_a_setup_error(tmp_path: Path) -> None:
    assert main(["check", str(tmp_path)]) == 2
