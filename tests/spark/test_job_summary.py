"""The driver's summary of few findings (spark/job.py _summarise): counts, examples in the
Spark path's order, and findings/ written as Spark's JSON writer would. No JVM."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from spark import job


def finding(kind: str, replica: str | None, index: int | None) -> dict[str, Any]:
    return {
        "kind": kind,
        "severity": "error",
        "group": "g",
        "replica": replica,
        "index": index,
        "file": None,
        "position": None,
        "detail": f"{kind} at {index}",
        "last_index": None,
        "count": 1,  # checks.merge_runs: a run of findings is one, counting them all
    }


def test_counts_examples_and_json_lines(tmp_path: Path) -> None:
    stale = tmp_path / "findings" / "part-00007.json"
    stale.parent.mkdir()
    stale.write_text("{}\n")
    found = [finding("b", "n1", 3), finding("a", "n0", 2), finding("b", None, 1)]
    found += [finding("c", "n0", i) for i in range(job.EXAMPLES_MAX + 5)]
    found += [{**finding("d", "n2", 10), "last_index": 14, "count": 5}]
    counts, examples = job._summarise(found, str(tmp_path))
    assert counts == [
        {"kind": "a", "severity": "error", "count": 1},
        {"kind": "b", "severity": "error", "count": 2},
        {"kind": "c", "severity": "error", "count": job.EXAMPLES_MAX + 5},
        {"kind": "d", "severity": "error", "count": 5},  # one finding standing for five
    ]
    assert [(e["kind"], e["replica"], e["index"]) for e in examples[:3]] == [
        ("a", "n0", 2),
        ("b", None, 1),  # nulls first, as Spark orders them
        ("b", "n1", 3),
    ]
    assert len(examples) == 3 + job.EXAMPLES_MAX + 1
    assert not stale.exists()  # an earlier run's part is replaced
    lines = (tmp_path / "findings" / "part-00000.json").read_text().splitlines()
    assert len(lines) == len(found)
    assert json.loads(lines[1]) == {
        "kind": "b",
        "severity": "error",
        "group": "g",
        "index": 1,
        "detail": "b at 1",
        "count": 1,
    }  # null fields left out


def test_no_findings_write_no_part(tmp_path: Path) -> None:
    assert job._summarise([], str(tmp_path)) == ([], [])
    assert not (tmp_path / "findings").exists()
