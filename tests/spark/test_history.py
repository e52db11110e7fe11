"""Reading a chaos history (spark/history.py): the fast paths (a block's lines judged at once,
ranges read by several processes, the usual ok line checked inline) find exactly what reading
it line by line with json.loads finds, wherever the ranges and blocks are cut (no JVM)."""

from __future__ import annotations

import itertools
import json
import random
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import pytest

from spark import history
from spark.history import AckedAppend
from spark.layout import InputUnreadable
from tests.spark.stores import write_history


def by_the_rules(path: Path) -> list[AckedAppend]:
    """The history's acknowledged appends, one json.loads per line holding "ok" (what the
    audit read before its fast paths, docs/audit.md)."""
    out = []
    for line in path.read_bytes().split(b"\n"):
        if b'"ok"' not in line:
            assert not line.strip() or line.strip()[:1] + line.strip()[-1:] == b"{}"
            continue
        op = json.loads(line)
        if op.get("type") == "ok" and op.get("f") == "append" and op.get("process") != "nemesis":
            out.append(
                history.acknowledged(
                    op["group"],
                    op.get("index"),
                    op["value"],
                    str(op.get("process")),
                    int(op.get("time_ns") or 0),
                )
            )
    return out


def every_kind_of_line(path: Path, n: int = 300, seed: int = 7) -> Path:
    """Ok appends written every way JSON allows (spaced or compact, keys in any order, escapes,
    raw UTF-8, no index, a float time, \\r\\n ends, leading blanks), among invocations whose
    value is "ok", fail and info records, nemesis records with nested values, blank lines; the
    last line without its newline."""
    rng = random.Random(seed)
    lines = []
    for i in range(1, n + 1):
        value = rng.choice(
            [f"v-{i}" * rng.randrange(1, 30), f'say "ok" \\ {i}', f"é-{i}-ü", "ok", "", "x\u2028y"]
        )
        op = {"process": i % 4, "f": "append", "value": value, "group": rng.choice("gh")}
        lines.append(json.dumps({"type": "invoke", **op, "index": None, "time_ns": i}))
        ok = {"type": "ok", **op, "index": rng.choice([i, i, i, None]), "time_ns": i + 0.5}
        if rng.random() < 0.5:
            ok["time_ns"] = i
        keys = list(ok)
        if rng.random() < 0.3:
            rng.shuffle(keys)
        compact = rng.random() < 0.5
        text = json.dumps(
            {k: ok[k] for k in keys},
            separators=(",", ":") if compact else (", ", ": "),
            ensure_ascii=rng.random() < 0.5,
        )
        lines.append(rng.choice(["", " ", "\t"]) + text + rng.choice(["", "", "\r", " "]))
        if i % 17 == 0:
            lines.append(json.dumps({"type": "fail", **op, "index": None, "time_ns": i}))
            lines.append("")
        if i % 29 == 0:
            nested = {"fault": "kill", "nodes": ["n1"], "note": "ok"}
            lines.append(json.dumps({"type": "ok", "process": "nemesis", "f": "kill",
                                     "value": nested, "time_ns": i}))  # fmt: skip
    path.write_bytes("\n".join(lines).encode())
    return path


def assert_same(acked: history.Acked, expected: list[AckedAppend]) -> None:
    assert len(acked) == len(expected)
    assert [acked.groups[k] for k in acked.group] == [a.group for a in expected]
    assert acked.index.tolist() == [a.index or 0 for a in expected]
    assert acked.digest.tobytes() == b"".join(a.digest for a in expected)
    got = acked.details(np.ones(len(acked), dtype=bool))
    assert [attrs.astuple(a) for a in got] == [attrs.astuple(a) for a in expected]


def test_every_kind_of_line_is_read_as_json_loads_reads_it(tmp_path: Path) -> None:
    path = every_kind_of_line(tmp_path / "history.jsonl")
    expected = by_the_rules(path)
    assert len(expected) == 300 and any(a.index is None for a in expected)
    assert_same(history.read_acked(str(path)), expected)


def usual_lines(path: Path, n: int = 200, seed: int = 3) -> Path:
    """Ok appends as the harness writes them (compact, "error", sometimes "node") and as
    bench.audit writes them (with spaces), values without escapes but with JSON's own
    characters; among them lines nearly of that shape (no index, a float time, a process
    "nemesis", an extra key), which must go to json."""
    rng = random.Random(seed)
    lines = []
    for i in range(1, n + 1):
        value = rng.choice([f"v{i}", f"{{ok}}: [{i}], ", "", "'ok'", "x" * rng.randrange(2000)])
        op = {"process": i % 5, "f": "append", "value": value, "group": rng.choice(["g", "ok"])}
        lines.append(json.dumps({"type": "invoke", **op, "index": None, "time_ns": i}))
        ok = {"type": "ok", **op, "index": i, "time_ns": i}
        if i % 3:
            ok["error"] = None
        if i % 4 == 0:
            ok["node"] = "n1"
        odd = rng.random()
        if odd < 0.05:
            ok["index"] = None
        elif odd < 0.1:
            ok["time_ns"] = i + 0.25
        elif odd < 0.15:
            ok["process"] = "nemesis"
        elif odd < 0.2:
            ok["extra"] = 1
        compact = rng.random() < 0.5
        lines.append(json.dumps(ok, separators=(",", ":") if compact else (", ", ": ")))
    path.write_text("".join(line + "\n" for line in lines))
    return path


def test_the_usual_lines_are_read_by_the_pattern_as_json_loads_reads_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = usual_lines(tmp_path / "history.jsonl")
    lines = path.read_bytes().splitlines()
    usual = sum(1 for line in lines if history._USUAL.fullmatch(line))
    assert usual > 100
    odd = [line for line in lines if b'"ok"' in line and not history._USUAL.fullmatch(line)]
    assert len(odd) > 10  # these are parsed by json
    taken: list[bytes] = []
    parse = history._Columns.take
    monkeypatch.setattr(
        history._Columns, "take", lambda self, line, at: taken.append(line) or parse(self, line, at)
    )
    assert_same(history.read_acked(str(path)), by_the_rules(path))
    assert len(taken) == len(odd)  # the pattern took the usual lines, json the others
    with open(path, "a") as f:  # the pattern's shape, but no index: json says why
        f.write('{"type":"ok","process":1,"f":"append","value":"v","group":"g","index":0,')
        f.write('"time_ns":5,"error":null}\n')
    with pytest.raises(InputUnreadable, match=f"line {len(lines) + 1}: index 0 is not an index"):
        history.read_acked(str(path))


@pytest.mark.parametrize("read_bytes", [1, 7, 64, 1000])
@pytest.mark.parametrize("lines", [every_kind_of_line, usual_lines])
def test_any_cut_into_ranges_and_blocks_reads_the_same(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, read_bytes: int, lines: Any
) -> None:
    """Ranges start and end anywhere (inside a line, on a newline), blocks too."""
    path = lines(tmp_path / "history.jsonl", n=60)
    expected = by_the_rules(path)
    monkeypatch.setattr(history, "READ_BYTES", read_bytes)
    size = path.stat().st_size
    rng = random.Random(read_bytes)
    for ranges in (1, 2, 5, 40):
        cuts = sorted({0, size, *(rng.randrange(size) for _ in range(ranges - 1))})
        parts = [history.read_range(str(path), lo, hi) for lo, hi in itertools.pairwise(cuts)]
        assert all(p.error is None for p in parts)
        assert_same(history.joined(str(path), parts), expected)


def test_a_large_history_is_read_by_worker_processes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = every_kind_of_line(tmp_path / "history.jsonl")
    monkeypatch.setattr(history, "PARALLEL_BYTES_MIN", 0)
    monkeypatch.setattr(history, "RANGE_BYTES", 4096)
    reading = history.Reading(str(path), processes=2)
    assert reading.ranges > 2
    assert_same(reading.result(), by_the_rules(path))


def test_the_first_bad_line_is_told_with_its_number(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    acks = [("g", i, f"value {i}", 0, i) for i in range(1, 201)]
    path = write_history(tmp_path / "history.jsonl", acks)
    lines = path.read_text().splitlines()
    lines[251] = lines[251][:-1]  # an ok line cut short
    lines[300] = "not json"
    path.write_text("\n".join(lines) + "\n")
    monkeypatch.setattr(history, "PARALLEL_BYTES_MIN", 0)
    monkeypatch.setattr(history, "RANGE_BYTES", 1000)  # the bad lines in later ranges
    with pytest.raises(InputUnreadable, match=r": line 252: not JSON: Expecting"):
        history.read_acked(str(path), processes=2)
    lines[251] = "[1]"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(InputUnreadable, match=r": line 252: not JSON: not an object"):
        history.read_acked(str(path))


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ('{"type":"ok","f":"append","process":0,"group":"g","index":0,"value":"v"}', "index 0"),
        ('{"type":"ok","f":"append","process":0,"group":"g","index":true,"value":"v"}', "index"),
        ('{"type":"ok","f":"append","process":0,"group":"g","index":1,"value":7}', "group/value"),
        ('{"type":"ok","f":"append","process":0,"index":1,"value":"v"}', "group/value"),
        ('{"type":"ok","f":"append","group":"g","index":1,"value":"v","time_ns":"x"}', "time_ns"),
        ('{"type":"ok"} {"type":"ok"}', "Extra data"),
        ('["ok"]', "not a JSON object"),
    ],
)
def test_an_ok_line_that_is_not_an_acknowledged_append_is_unreadable(
    tmp_path: Path, line: str, reason: str
) -> None:
    path = write_history(tmp_path / "history.jsonl", [("g", 1, "v", 0, 1)])
    path.write_text(path.read_text() + line + "\n")
    with pytest.raises(InputUnreadable, match=f"line 3: .*{reason}"):
        history.read_acked(str(path))


def test_a_line_longer_than_the_bound_is_unreadable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(history, "HISTORY_LINE_BYTES_MAX", 150)
    monkeypatch.setattr(history, "READ_BYTES", 64)
    acks = [("g", 1, "v", 0, 1), ("g", 2, "w" * 100, 0, 2)]
    path = write_history(tmp_path / "history.jsonl", acks)
    with pytest.raises(InputUnreadable, match="line 3: longer than 150"):
        history.read_acked(str(path))


def test_digests_by_group_and_highest(tmp_path: Path) -> None:
    acks = [("g", 5, "five", 0, 1), ("h", 2, "two", 1, 2), ("g", 3, "three", 0, 3)]
    acks += [("g", None, "none", 0, 4)]
    acked = history.read_acked(str(write_history(tmp_path / "history.jsonl", acks)))
    assert acked.highest() == {"g": 5, "h": 2}
    digests = acked.digests_by_group()
    assert digests["g"][0].tolist() == [3, 5] and digests["h"][0].tolist() == [2]
    assert digests["g"][1][1].tobytes() == history.acknowledged("g", 5, "five", "0", 1).digest


@pytest.mark.parametrize("after", ["\r", " \t", "\x0c", "\u00a0"])
def test_only_json_whitespace_may_follow_an_object(tmp_path: Path, after: str) -> None:
    path = tmp_path / "history.jsonl"
    line = '{"type":"ok","process":1,"f":"append","value":"v","group":"g","index":1,"time_ns":5}'
    path.write_text(line + after + "\n")
    if after.strip(" \t\r"):
        with pytest.raises(InputUnreadable, match="line 1: not JSON: Extra data"):
            history.read_acked(str(path))
    else:
        assert_same(history.read_acked(str(path)), by_the_rules(path))
