"""The store keeps only the newest `cache_tail_bytes` of its log in the page cache: after each
flush it lets go of the clean pages further behind the write position, mapped ones included,
and what it let go of still reads back intact (from disk)."""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os
from pathlib import Path

from dledger.log.page_cache import read_in
from dledger.log.store import LogStore, StoreConfig
from tests.log.helpers import batch_of, body, open_store, segment_files

SEGMENT = 1 << 20
TAIL = 256 << 10
ENTRY_BODY = 4000  # ~1 page an entry
ENTRIES = 900  # ~3.5 MiB: three full segments and part of a fourth

_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                       ctypes.c_int, ctypes.c_long]  # fmt: skip
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
MAP_FAILED = ctypes.c_void_p(-1).value


def resident(path: Path) -> list[bool]:
    """Which pages of the file are in the page cache now: mincore on a fresh mapping reports
    the page cache, whoever wrote or mapped the pages."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        address = _libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, f.fileno(), 0)
        if address == MAP_FAILED:
            raise OSError(ctypes.get_errno(), "mmap")
        try:
            vec = ctypes.create_string_buffer((size + mmap.PAGESIZE - 1) // mmap.PAGESIZE)
            if _libc.mincore(address, size, vec) != 0:
                raise OSError(ctypes.get_errno(), "mincore")
            return [byte & 1 == 1 for byte in vec.raw]
        finally:
            _libc.munmap(address, size)


def log_residency(store_dir: Path) -> list[bool]:
    """Residency of every page of the log, segment after segment."""
    return [page for path in segment_files(store_dir) for page in resident(path)]


def fill(store: LogStore, first: int, count: int) -> None:
    for index in range(first, first + count):
        store.append(batch_of(index, 1, 1, ENTRY_BODY))


def test_pages_behind_the_tail_are_let_go_of_after_a_flush(tmp_path: Path) -> None:
    config = StoreConfig(segment_bytes=SEGMENT, cache_tail_bytes=TAIL)
    with open_store(tmp_path, config) as store:
        fill(store, 1, ENTRIES)
        store.flush()
        write_position = store.next_position
        pages = log_residency(tmp_path)
        behind = (write_position - TAIL) // mmap.PAGESIZE  # pages wholly behind the tail
        assert behind > 2 * SEGMENT // mmap.PAGESIZE
        assert not any(pages[:behind]), "pages behind the tail stayed in the page cache"
        newest = write_position // mmap.PAGESIZE
        # the tail itself stays (its pages were written, so they are all in the cache)
        assert all(pages[behind + 1 : newest])
        # what was let go of reads back from disk, intact
        for index in (1, 2, 300, 600, ENTRIES):
            assert store._reader.get(index).body == body(index, 1, ENTRY_BODY)


def test_pages_read_through_the_mapping_are_let_go_of_too(tmp_path: Path) -> None:
    config = StoreConfig(segment_bytes=SEGMENT, cache_tail_bytes=TAIL)
    with open_store(tmp_path, config) as store:
        fill(store, 1, 40)
        store.flush()
        for index in range(1, 41):  # maps their pages into this process
            assert store._reader.get(index).body == body(index, 1, ENTRY_BODY)
        first_entries = store._reader.get(40).position // mmap.PAGESIZE
        fill(store, 41, ENTRIES - 40)
        store.flush()
        # (before any read: a fault on a page that was let go of reads its neighbours ahead)
        assert not any(log_residency(tmp_path)[:first_entries])


def test_tail_zero_leaves_the_page_cache_alone(tmp_path: Path) -> None:
    config = StoreConfig(segment_bytes=SEGMENT, cache_tail_bytes=0)
    with open_store(tmp_path, config) as store:
        fill(store, 1, ENTRIES)
        store.flush()
        written = store.next_position // mmap.PAGESIZE
        assert all(log_residency(tmp_path)[:written])


def test_letting_go_survives_truncation_reopen_and_rewrite(tmp_path: Path) -> None:
    config = StoreConfig(segment_bytes=SEGMENT, cache_tail_bytes=TAIL)
    with open_store(tmp_path, config) as store:
        fill(store, 1, ENTRIES)
        store.flush()
        store.truncate_after(ENTRIES - 300)  # back behind where pages were let go of
        fill(store, ENTRIES - 299, 300)
        store.flush()
        for index in range(1, ENTRIES + 1):
            assert store._reader.get(index).body == body(index, 1, ENTRY_BODY)
    with open_store(tmp_path, config) as store:
        fill(store, ENTRIES + 1, 300)
        store.flush()
        assert [store._reader.get(i).body for i in (1, ENTRIES, ENTRIES + 300)] == [
            body(i, 1, ENTRY_BODY) for i in (1, ENTRIES, ENTRIES + 300)
        ]


def test_cold_runs_read_in_what_was_let_go_of(tmp_path: Path) -> None:
    config = StoreConfig(segment_bytes=SEGMENT, cache_tail_bytes=TAIL)
    with open_store(tmp_path, config) as store:
        fill(store, 1, ENTRIES)
        store.flush()
        # entries 300-310 span a stretch of segment 1, let go of at the flush
        lo, hi = store.positions(300, 310)[::10]  # (from the index: a read would fault them in)
        assert store.left_cache(lo) and store.left_cache(hi)
        assert not any(log_residency(tmp_path)[lo // mmap.PAGESIZE : hi // mmap.PAGESIZE])
        runs = store.cold_runs([(lo, hi)])
        assert [(offset, length) for _, offset, length in runs] == [(lo - SEGMENT, hi - lo)]
        assert read_in(runs) == hi - lo
        assert all(log_residency(tmp_path)[lo // mmap.PAGESIZE : hi // mmap.PAGESIZE])
        # the newest bytes are in the tail: nothing to read in
        newest = store.positions(ENTRIES, ENTRIES)[0]
        assert not store.left_cache(newest)
        assert store.cold_runs([(newest, store.next_position)]) == []
        # a span across a segment boundary comes back as one run per segment
        runs = store.cold_runs([(SEGMENT - 100, SEGMENT + 100)])
        assert [(offset, length) for _, offset, length in runs] == [(SEGMENT - 100, 100), (0, 100)]
        assert read_in(runs) == 200
