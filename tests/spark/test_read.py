"""The executor-side reader on stores written by LogStore, without a JVM."""

from __future__ import annotations

import itertools
import zlib
from pathlib import Path

import numpy as np

from spark import formats, layout, parse, read
from tests.spark import stores


def test_crc32_rows_matches_zlib() -> None:
    rng = np.random.default_rng(7)
    for n, width in ((50, formats.ENTRY_HEADER_CRC_BYTES), (9, 43), (5, 3), (4, 0), (0, 40)):
        rows = rng.integers(0, 256, size=(n, width), dtype=np.uint8)
        got = parse.crc32_rows(rows)
        assert got.dtype == np.uint32
        assert got.tolist() == [zlib.crc32(r.tobytes()) for r in rows], (n, width)
    # a strided view (columns of the wider header rows the parser slices) gives the same
    wide = rng.integers(0, 256, size=(20, formats.ENTRY_HEADER_BYTES), dtype=np.uint8)
    part = wide[:, : formats.ENTRY_HEADER_CRC_BYTES]
    assert parse.crc32_rows(part).tolist() == [zlib.crc32(r.tobytes()) for r in part]


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
