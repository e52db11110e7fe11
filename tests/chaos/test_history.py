"""history.jsonl (docs/formats.md#chaos-history) and final.json: round trips, torn tails,
bad lines named."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from chaos import final
from chaos.history import (
    HistoryUnreadable,
    HistoryWriter,
    Phase,
    RunClock,
    read_history,
    write_history,
)
from tests.chaos.histories import Builder, agreeing, entries, replica

FORMAT_KEYS = {"type", "process", "f", "value", "group", "index", "time_ns", "error"}


def sample() -> list:
    b = Builder().append(0, "0-0", index=2, node="n1").append(1, "1-0", "info")
    b.fault("partition", {"fault": "partition-halves", "drops": [["n0", "n1"]]})
    b.append(0, "0-1", "fail").fault("partition", {"fault": "partition-halves"}, "ok")
    return b.ops


def test_history_round_trips_through_jsonl(tmp_path: Path) -> None:
    path = tmp_path / "history.jsonl"
    ops = sample()
    write_history(path, ops)
    assert read_history(path) == ops
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert all(set(row) >= FORMAT_KEYS for row in rows)
    ok = rows[1]
    assert (ok["type"], ok["process"], ok["index"], ok["node"]) == ("ok", 0, 2, "n1")
    assert rows[4]["process"] == "nemesis" and rows[4]["value"]["drops"] == [["n0", "n1"]]


def test_the_writer_records_monotonic_times_since_the_run_started(tmp_path: Path) -> None:
    clock = RunClock()
    path = tmp_path / "history.jsonl"
    with HistoryWriter(path, clock) as history:
        for i in range(5):
            history.record(0, Phase.INVOKE, "append", f"0-{i}")
            history.record(0, Phase.OK, "append", f"0-{i}", index=i + 1, node="n0")
    ops = read_history(path)
    assert ops == history.ops
    times = [op.time_ns for op in ops]
    assert times == sorted(times) and 0 <= times[0] < 10**9


def test_a_torn_last_line_is_skipped_but_a_bad_line_is_named(tmp_path: Path) -> None:
    path = tmp_path / "history.jsonl"
    write_history(path, sample())
    whole = path.read_text()
    path.write_text(whole + '{"type":"invo')  # the writer was killed mid-line
    assert len(read_history(path)) == len(sample())
    lines = whole.splitlines()
    lines[2] = "not json"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(HistoryUnreadable, match=r"history\.jsonl:3: not JSON"):
        read_history(path)
    lines[2] = json.dumps({"type": "finished", "process": 0, "f": "append", "time_ns": 1})
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(HistoryUnreadable, match=":3: bad operation"):
        read_history(path)


def test_final_state_round_trips_with_binary_bodies(tmp_path: Path) -> None:
    state = agreeing([None, "0-0", "1-0"])
    config = final.LogEntry(4, 2, 2, b"\x81\xa6voters\xff")  # msgpack, not UTF-8
    odd = replica("n3", (*entries([None, "0-0", "1-0"]), config))
    state = final.FinalState(
        {**state.replicas, "n3": odd}, complete=True, converged=True, crashes=({"node": "n1"},)
    )
    path = tmp_path / final.FINAL_FILE
    final.save(path, state)
    assert final.load(path) == state
    assert final.load(tmp_path / "absent.json") == final.NO_FINAL_READ
