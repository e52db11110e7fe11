"""The per-replica facts the checks join against (no JVM)."""

from __future__ import annotations

from pathlib import Path

from spark.history import read_acked
from spark.job import replica_rows
from spark.layout import Replica
from tests.spark.stores import write_history


def replica(group: str, name: str, commit: int) -> Replica:
    return Replica(
        group, name, f"/s/{group}/{name}", 1 << 20, 4096, 1, 0, 0, commit, commit, True, (), ()
    )


def test_group_commit_is_the_highest_checkpoint() -> None:
    rows = replica_rows([replica("g", "n0", 10), replica("g", "n1", 40), replica("h", "n0", 5)])
    assert [(r[0], r[1], r[-1]) for r in rows] == [("g", "n0", 40), ("g", "n1", 40), ("h", "n0", 5)]
    assert [(r[-3], r[-2]) for r in rows] == [(2, 2), (2, 2), (1, 1)]  # group size, quorum


def test_an_acknowledged_index_raises_the_group_commit(tmp_path: Path) -> None:
    """Checkpoints lag; an acknowledgement is a commit, so the history raises the bound."""
    history = write_history(
        tmp_path / "history.jsonl",
        [("g", 55, "v", 0, 1), ("g", None, "w", 0, 2), ("h", 3, "x", 1, 3)],
    )
    acked = read_acked(str(history)).highest()
    assert acked == {"g": 55, "h": 3}
    rows = replica_rows(
        [replica("g", "n0", 10), replica("g", "n1", 40), replica("h", "n0", 5)], acked
    )
    assert [r[-1] for r in rows] == [55, 55, 5]


def test_the_raise_stops_at_the_highest_index_any_replica_holds() -> None:
    """An acknowledged index past every log is a missing append, not a commit to check."""
    acked = {"g": 55}
    rows = replica_rows([replica("g", "n0", 10), replica("g", "n1", 40)], acked, {"g": 50})
    assert [r[-1] for r in rows] == [50, 50]
    rows = replica_rows([replica("g", "n0", 10), replica("g", "n1", 40)], acked, {"g": 30})
    assert [r[-1] for r in rows] == [40, 40]  # never below the checkpoints
