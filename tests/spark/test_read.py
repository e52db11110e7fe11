"""The executor-side reader on stores written by LogStore, without a JVM."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from spark import crc, formats, layout, parse, read
from tests.spark import stores


def test_chunks_read_every_entry_once_with_the_entry_before(tmp_path: Path) -> None:
    stores.write_group(tmp_path, "g", 40, replicas=("n0",))
    (replica,) = layout.discover([str(tmp_path)])
    tasks = read.plan([replica])
    assert [(t.lo, t.hi) for t in tasks] == [(1, 49)]  # 3 index files of 16, one task
    with parse.Files(replica) as files:
        batches = [read.read_chunk(replica, files, lo, lo + 16) for lo in (1, 17, 33, 49)]
    rows = [row for batch in batches for row in batch.to_pylist()]
    assert [r["index"] for r in rows] == list(range(1, 41))
    assert all(r["header_ok"] and r["body_ok"] for r in rows)
    assert batches[3].num_rows == 0  # slots past the last entry: nothing
    for before, row in itertools.pairwise(rows):
        assert row["prev_end"] == before["position"] + before["size"]
        assert row["prev_term"] == before["term"]
        if row["position"] != row["prev_end"]:  # crossed into the next segment
            assert row["position"] % stores.SEGMENT_BYTES == 0
            assert row["prev_after_magic"] in (formats.BLANK_MAGIC, None)
    assert rows[-1]["after_magic"] == formats.END_MAGIC


def test_corrupt_body_and_index_term_are_reported_as_read(tmp_path: Path) -> None:
    paths = stores.write_group(tmp_path, "g", 20, replicas=("n0",))
    stores.corrupt_body(paths["n0"], 5)
    stores.set_record_term(paths["n0"], 7, 9)
    (replica,) = layout.discover([str(tmp_path)])
    with parse.Files(replica) as files:
        rows = read.read_chunk(replica, files, 1, 17).to_pylist()
    assert [r["index"] for r in rows if not r["body_ok"]] == [5]
    assert [(r["index"], r["rec_term"], r["term"]) for r in rows if r["rec_term"] != r["term"]] == [
        (7, 9, 1)
    ]


def test_missing_segment_is_a_defect(tmp_path: Path) -> None:
    paths = stores.write_group(tmp_path, "g", 40, replicas=("n0",))
    _, _, (position, *_) = stores.index_record(paths["n0"], 30)
    segment, _ = stores.segment_of(paths["n0"], position)
    segment.unlink()
    (replica,) = layout.discover([str(tmp_path)])
    with parse.Files(replica) as files:
        rows = read.read_chunk(replica, files, 17, 33).to_pylist()
    (row,) = [r for r in rows if r["index"] == 30]
    assert row["defect"] == f"segment file data/{segment.name} missing" and not row["header_ok"]


@pytest.mark.parametrize("damage", [None, "header", "body"])
def test_the_whole_run_check_reads_what_the_entry_by_entry_check_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, damage: str | None
) -> None:
    """crc.run_intact judges a healthy run of entries at once; a damaged one is read entry by
    entry, and the rows are the same as if every run had been read entry by entry."""
    paths = stores.write_group(tmp_path, "g", 40, replicas=("n0",))
    if damage == "header":  # the last byte of entry 9's term: only its header CRC fails
        _, _, (position, *_) = stores.index_record(paths["n0"], 9)
        segment, at = stores.segment_of(paths["n0"], position)
        stores.flip_byte(segment, at + 23)
    elif damage == "body":
        stores.corrupt_body(paths["n0"], 9)
    (replica,) = layout.discover([str(tmp_path)])

    def read_all() -> list[dict[str, object]]:
        with parse.Files(replica) as files:
            return read.read_chunk(replica, files, 1, 49).to_pylist()

    rows = read_all()
    with monkeypatch.context() as m:
        m.setattr(crc, "run_intact", lambda *args: False)
        assert read_all() == rows
    bad_header = [r["index"] for r in rows if not r["header_ok"]]
    bad_body = [r["rec_index"] for r in rows if r["header_ok"] and not r["body_ok"]]
    assert (bad_header, bad_body) == {
        None: ([], []),
        "header": ([9], []),
        "body": ([], [9]),
    }[damage]


def test_small_read_tasks_share_a_spark_task_and_large_ones_keep_their_own() -> None:
    big = read.TASK_RECORDS_MAX
    assert read.pack([60] * 66, 1) == [list(range(66))]  # a test store: one Spark task
    assert read.pack([10] * 10, 2) == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]  # both cores
    assert read.pack([big, big, 60, 60, big], 2) == [[0], [1], [2, 3], [4]]
    assert read.pack([big // 2] * 4, 1) == [[0, 1], [2, 3]]  # none over TASK_RECORDS_MAX
    assert read.pack([5], 8) == [[0]]
