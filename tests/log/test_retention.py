"""Retention: whole old segments go by age at the delete hour, or at once when the disk is
too full, never one holding an index the caller still needs; reads below the new start are
answered "compacted"."""

from __future__ import annotations

import os
import shutil
from datetime import datetime
from pathlib import Path
from typing import NamedTuple

import pytest

from dledger.log import retention
from dledger.log.errors import Compacted
from dledger.log.store import LogStore
from tests.log.helpers import SMALL, batch_of, body, index_files, open_store, segment_files

NOW = datetime(2026, 3, 1, 4, 30)  # 04:30
HOUR_S = 3600.0
SEG = SMALL.segment_bytes
PER_SEGMENT = 62  # 1044-byte entries per 64 KiB segment


def filled(tmp_path: Path, segments: int = 5) -> LogStore:
    """A store spread over `segments` segments, every file 100 hours old except the last."""
    store = open_store(tmp_path, SMALL)
    while len(segment_files(tmp_path)) < segments:
        store.append(batch_of(store.last_index + 1, 1, 20, size=1000))
    store.flush()
    old = NOW.timestamp() - 100 * HOUR_S
    for path in segment_files(tmp_path)[:-1]:
        os.utime(path, (old, old))
    return store


def expire(store: LogStore, **kwargs: object) -> list[str]:
    args: dict = {
        "now": NOW,
        "keep_from_index": store.last_index + 1,
        "file_reserved_hours": 72,
        "delete_when_hour": 4,
        "disk_max_used_ratio": 1.0,
    } | kwargs
    return store.delete_expired(**args)


def test_old_segments_go_at_the_delete_hour(tmp_path: Path) -> None:
    with filled(tmp_path) as store:
        assert expire(store, now=NOW.replace(hour=5)) == []  # not the hour
        assert expire(store, file_reserved_hours=101) == []  # not old enough
        deleted = expire(store)
        assert deleted[:4] == [
            f"data/{p}" for p in ("0" * 20, f"{SEG:020d}", f"{2 * SEG:020d}", f"{3 * SEG:020d}")
        ]
        assert len(segment_files(tmp_path)) == 1  # the one being written stays
        first = store.first_index
        assert store.get(first).position == 4 * SEG
        assert store.term_at(first - 1) == 1
        with pytest.raises(Compacted) as info:
            store.get(1)
        assert info.value.first_index == first
        assert str(info.value) == f"index 1 is compacted; first available index is {first}"


def test_any_hour_when_no_delete_hour(tmp_path: Path) -> None:
    with filled(tmp_path) as store:
        assert len(expire(store, now=NOW.replace(hour=13), delete_when_hour=None)) >= 4


def test_never_past_keep_from_index(tmp_path: Path) -> None:
    with filled(tmp_path) as store:
        keep = store.get(2 * PER_SEGMENT + 5).index  # an entry in the third segment
        deleted = expire(store, keep_from_index=keep)
        assert [d for d in deleted if d.startswith("data/")] == [
            f"data/{0:020d}",
            f"data/{SEG:020d}",
        ]
        assert store.first_index <= keep
        assert store.get(keep).body == body(keep, 1, 1000)


def test_full_disk_deletes_young_segments_until_below_the_ratio(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    class Usage(NamedTuple):
        total: int
        used: int
        free: int

    with filled(tmp_path) as store:
        for path in segment_files(tmp_path):
            os.utime(path)  # all young: only the disk ratio can delete them
        allocated = segment_files(tmp_path)[0].stat().st_blocks * 512
        total = 100 * allocated
        used = 91 * allocated + allocated // 2  # 91.5%: two segments bring it under 90%
        monkeypatch.setattr(retention, "disk_usage", lambda path: Usage(total, used, 0))
        assert expire(store, disk_max_used_ratio=0.95) == []
        deleted = expire(store, disk_max_used_ratio=0.90, now=NOW.replace(hour=9))
        assert [d for d in deleted if d.startswith("data/")] == [
            f"data/{0:020d}",
            f"data/{SEG:020d}",
        ]


def test_reopen_after_retention(tmp_path: Path) -> None:
    with filled(tmp_path) as store:
        expire(store)
        first, last = store.first_index, store.last_index
    with open_store(tmp_path, SMALL) as store:
        assert (store.first_index, store.last_index) == (first, last)
        assert store.get(first).body == body(first, 1, 1000)
        store.append(batch_of(last + 1, 2, 3))


def test_files_left_by_a_crash_during_retention_are_removed(tmp_path: Path) -> None:
    """Meta moves first, files go after: a crash in between leaves files below the start."""
    with filled(tmp_path) as store:
        keep = tmp_path / "saved"
        shutil.copy(segment_files(tmp_path)[0], keep)
        expire(store)
        first = store.first_index
    shutil.copy(keep, tmp_path / "dledger" / "data" / ("0" * 20))
    with open_store(tmp_path, SMALL) as store:
        assert store.first_index == first
        assert not (tmp_path / "dledger" / "data" / ("0" * 20)).exists()


def test_index_files_go_with_the_entries_they_held(tmp_path: Path) -> None:
    with filled(tmp_path, segments=8) as store:
        before = len(index_files(tmp_path))
        expire(store)
        first = store.first_index
        remaining = [int(p.name) for p in index_files(tmp_path)]
        assert len(remaining) < before
        assert all(f + SMALL.index_records_per_file > first for f in remaining)
        assert store.read(first, store.last_index, 10**9).payloads[0] == body(first, 1, 1000)
