"""The audit on stores written by the project's log writer, each group holding one fault.

One audit run covers every fault (a group per fault, so each group's findings are exactly its
fault's), which keeps the JVM work of this file to two jobs. Each fault is named precisely:
group, replica, index, file and position.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from spark import audit
from tests.spark import stores
from tests.spark.stores import payload, write_group, write_replica

pytestmark = pytest.mark.spark
N = 60  # entries per replica: ~4 segments of 4 KiB, 4 index files of 16 records


def bodies(group: str, n: int = N) -> list[bytes]:
    return [payload(group, i) for i in range(1, n + 1)]


@pytest.fixture(scope="module")
def faults(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Stores with one fault per group, and what the audit must say about each."""
    root = tmp_path_factory.mktemp("faults")
    expected: dict[str, Any] = {}

    # a divergent committed entry: n2 holds another body of the same size at index 30
    other = bodies("divergent")
    other[29] = bytes(reversed(other[29]))
    for r in ("n0", "n1"):
        write_replica(root, "divergent", r, bodies("divergent"), commit_index=N)
    n2 = write_replica(root, "divergent", "n2", other, commit_index=N)
    _, _, (position, *_) = stores.index_record(n2, 30)
    segment, _ = stores.segment_of(n2, position)
    expected["divergent"] = [("divergent_entry", "n2", 30, f"data/{segment.name}", position)]

    # the same edit made invisible to CRC-32: n2's body at 30 rewritten, 4 bytes fixing its CRC
    stores_ = write_group(root, "forged", N)
    expected["forged"] = [
        ("divergent_entry", "n2", 30, *stores.forge_body(stores_["n2"], 30, b"FORGED BY HAND"))
    ]

    # a follower cut inside entry 55 (a kill mid-write): said once, not per entry after it
    stores_ = write_group(root, "cut", N)
    _, _, (position, *_) = stores.index_record(stores_["n2"], 55)
    segment, at = stores.segment_of(stores_["n2"], position)
    assert at > 0 and stores.segment_of(stores_["n2"], _last_position(stores_["n2"]))[0] == segment
    with open(segment, "r+b") as f:
        f.truncate(at + 60)
    expected["cut"] = [("malformed_entry", "n2", 55, f"data/{segment.name}", position)]

    # a deleted middle segment on n1: one finding for all its entries, counted exactly
    stores_ = write_group(root, "deleted", N)
    middle = sorted((stores_["n1"] / "dledger" / "data").iterdir())[1]
    middle.unlink()
    held = [
        i
        for i in range(1, N + 1)
        if stores.segment_of(stores_["n1"], _position(stores_["n1"], i))[0] == middle
    ]
    first = _position(stores_["n1"], held[0])
    expected["deleted"] = [("malformed_entry", "n1", held[0], f"data/{middle.name}", first)]

    # a truncated uncommitted tail: not an error, three notes
    for r in ("n0", "n1"):
        write_replica(root, "tail", r, bodies("tail"), commit_index=50)
    write_replica(root, "tail", "n2", bodies("tail"), commit_index=50, truncate_after=55)
    expected["tail"] = [
        ("uncommitted_tail", r, 51, *_where(root / "tail" / r, 51)) for r in ("n0", "n1", "n2")
    ]

    # a corrupt body CRC on n1 at index 20
    stores_ = write_group(root, "corrupt", N)
    expected["corrupt"] = [("malformed_entry", "n1", 20, *stores.corrupt_body(stores_["n1"], 20))]

    # an index record that disagrees with the data: n0's record for 25 says term 7
    stores_ = write_group(root, "index", N)
    expected["index"] = [
        ("index_mismatch", "n0", 25, *stores.set_record_term(stores_["n0"], 25, 7))
    ]

    # a committed entry held by one replica only: index 60 is only on n0, which committed it
    n0 = write_replica(root, "lonely", "n0", bodies("lonely"), commit_index=N)
    for r in ("n1", "n2"):
        write_replica(root, "lonely", r, bodies("lonely"), commit_index=59, truncate_after=59)
    expected["lonely"] = [("under_replicated", "n0", 60, *_where(n0, 60))]

    # an acknowledged append missing, given a history: 40 present, one at 41 never committed
    write_group(root, "history", 40)
    # and the CRC-keeping edit on every replica: they agree, but the acknowledged value is gone
    forged = write_group(root, "forged-all", 40)
    for r in stores.REPLICAS:
        file, position = stores.forge_body(forged[r], 30, b"FORGED BY HAND")
    history = root / "history.jsonl"
    lines = []
    acks = [("history", i, payload("history", i).decode()) for i in range(1, 41)]
    acks += [("history", 41, "lost-append")]
    acks += [("forged-all", i, payload("forged-all", i).decode()) for i in range(1, 41)]
    for n, (group, i, value) in enumerate(acks):
        lines.append(
            {
                "type": "invoke",
                "process": i % 3,
                "f": "append",
                "value": value,
                "group": group,
                "index": None,
                "time_ns": n * 10,
                "error": None,
            }
        )
        lines.append(
            {
                "type": "ok",
                "process": i % 3,
                "f": "append",
                "value": value,
                "group": group,
                "index": i,
                "time_ns": n * 10 + 5,
                "error": None,
            }
        )
    lines.append(
        {
            "type": "invoke",
            "process": "nemesis",
            "f": "kill",
            "value": {"nodes": ["n1"]},
            "time_ns": 999,
            "error": None,
        }
    )
    history.write_text("".join(json.dumps(line) + "\n" for line in lines))
    expected["history"] = [("missing_append", None, 41, None, None)]
    expected["forged-all"] = [("missing_append", "n0", 30, file, position)]
    return {"root": root, "history": history, "expected": expected}


def _position(store: Path, index: int) -> int:
    return stores.index_record(store, index)[2][0]


def _last_position(store: Path) -> int:
    return _position(store, N)


def _where(store: Path, index: int) -> tuple[str, int]:
    _, _, (position, *_) = stores.index_record(store, index)
    segment, _ = stores.segment_of(store, position)
    return f"data/{segment.name}", position


def test_each_fault_is_found_and_named(
    spark: SparkSession, faults: dict[str, Any], tmp_path: Path
) -> None:
    out = tmp_path / "out"
    argv = [
        "--stores",
        str(faults["root"]),
        "--out",
        str(out),
        "--history",
        str(faults["history"]),
        "--quiet",
    ]
    assert audit.main(argv, spark=spark) == 1
    report = json.loads((out / "report.json").read_text())
    found: dict[str, list[tuple[Any, ...]]] = {group: [] for group in faults["expected"]}
    for kind, f in report["findings"].items():
        assert f["count"] == sum(e["count"] for e in f["examples"]), kind  # all shown
        for e in f["examples"]:
            found[e["group"]].append((kind, e["replica"], e["index"], e["file"], e["position"]))
    for group, expected in faults["expected"].items():
        assert sorted(found[group], key=str) == sorted(expected, key=str), group
    assert report["verdict"] == "inconsistent" and report["exit_code"] == 1
    assert report["commit_index"]["lonely"] == N and report["commit_index"]["tail"] == 50
    assert report["entries_checked"] == 3 * N * 8 - 5 - 2 + 3 * 40 * 2  # tail, lonely cut 5, 2
    assert report["history"] == {"file": str(faults["history"]), "acknowledged": 81}
    assert (out / "report.html").read_text().count("<h2>group ") == 10
    malformed = {e["group"]: e for e in report["findings"]["malformed_entry"]["examples"]}
    assert (malformed["cut"]["index"], malformed["cut"]["last_index"]) == (55, N)
    assert malformed["cut"]["count"] == N - 55 + 1
    assert (
        "ends at byte" in malformed["cut"]["detail"]
        and "inside this entry" in (malformed["cut"]["detail"])
    )
    deleted = malformed["deleted"]
    assert deleted["count"] == deleted["last_index"] - deleted["index"] + 1 > 5
    assert "missing" in deleted["detail"]
    cut = next(r for r in report["replicas"] if (r["group"], r["replica"]) == ("cut", "n2"))
    assert (cut["entries"], cut["last_index"]) == (N, N)  # what the index files claim
    assert (cut["sound_entries"], cut["sound_last_index"]) == (54, 54)  # what was read
    forged = report["findings"]["missing_append"]["examples"]
    assert any("FORGED BY HAND" in e["detail"] and "n0, n1, n2 hold" in e["detail"] for e in forged)


def test_a_clean_two_group_store_passes(
    spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_group(tmp_path / "stores", "broker-a", 80)
    write_group(tmp_path / "stores", "broker-b", 50)
    out = tmp_path / "out"
    argv = ["--stores", str(tmp_path / "stores"), "--out", str(out), "--quiet"]
    assert audit.main(argv, spark=spark) == 0
    assert spark.range(3).count() == 3  # a session handed to main is left running
    report = json.loads((out / "report.json").read_text())
    assert report["verdict"] == "consistent" and report["findings"] == {}
    assert report["entries_checked"] == 3 * 80 + 3 * 50
    assert [g["group"] for g in report["groups"]] == ["broker-a", "broker-b"]
    assert sorted(report) == sorted(
        [
            "verdict",
            "exit_code",
            "master",
            "stores",
            "history",
            "elapsed_s",
            "entries_checked",
            "tasks",
            "groups",
            "replicas",
            "commit_index",
            "findings",
            "broker",
        ]
    )
    assert report["broker"] is None  # no broker store among them
    assert "CONSISTENT: 390 entries of 6 replicas in 2 groups" in capsys.readouterr().out
