"""Opening a damaged store: torn tails are cut and reported, damage that valid entries
follow is refused with the file, position and reason (and cut with repair=True), lost or
stale index files are rebuilt (docs/formats.md#recovery, docs/log-store.md)."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from dledger import limits
from dledger.log.errors import CorruptEntry, CorruptStateFile
from dledger.log.layout import file_name
from dledger.log.store import LogStore, StoreConfig
from tests.log.helpers import (
    SMALL,
    TINY,
    batch_of,
    body,
    flip,
    index_files,
    open_store,
    segment_files,
)

HEADER = limits.ENTRY_HEADER_BYTES


def where(store: LogStore, index: int) -> tuple[Path, int, int]:
    """(segment file, offset in it, entry size) of an entry."""
    entry = store.get(index)
    base = entry.position - entry.position % store.segment_bytes
    return store.paths.segment(base), entry.position - base, entry.size


def crashed(tmp_path: Path, durable: int, unsynced: int, config: StoreConfig = TINY) -> dict:
    """A store with `durable` entries flushed and checkpointed, then `unsynced` more written,
    then a crash. Returns where every entry lies."""
    store = open_store(tmp_path, config)
    store.append(batch_of(1, 1, durable))
    store.flush()
    store.write_checkpoint(0, 0)
    store.append(batch_of(durable + 1, 2, unsynced))
    places = {i: where(store, i) for i in range(1, durable + unsynced + 1)}
    store.abandon()
    return places


def assert_log(store: LogStore, last: int, size: int | None = None) -> None:
    """Entries 1..last are there, as written, and nothing after them."""
    assert store.last_index == last
    for index in range(1, last + 1):
        assert store.get(index).body == body(index, store.term_at(index), size)
    assert store.durable_index == last


class TestTornTail:
    def test_flipped_byte_in_the_last_entry_is_cut(self, tmp_path: Path) -> None:
        places = crashed(tmp_path, durable=10, unsynced=5)
        path, offset, size = places[15]
        flip(path, offset + HEADER + 3)
        with open_store(tmp_path) as store:
            assert_log(store, 14)
            report = store.recovery
            assert not report.clean_shutdown
            assert (report.cut_entries, report.cut_bytes) == (1, size)
            assert report.index_records_cleared == 1
            assert report.walked_from_index == 11 and report.entries_checked == 4

    @pytest.mark.parametrize("seed", range(8))
    def test_random_flips_in_the_tail_are_cut(self, tmp_path: Path, seed: int) -> None:
        """Flips anywhere from the last entry to the segment end: the log keeps every entry
        before the first damaged byte and never serves a damaged one."""
        rng = random.Random(seed)
        places = crashed(tmp_path, durable=10, unsynced=6)
        path, offset, _ = places[16]
        for _ in range(rng.randint(1, 5)):
            flip(path, rng.randrange(offset, TINY.segment_bytes), rng.randint(1, 255))
        with open_store(tmp_path) as store:
            assert 15 <= store.last_index <= 16
            assert_log(store, store.last_index)
            data = path.read_bytes()
            end = store.next_position % TINY.segment_bytes
            assert data[end:] == bytes(len(data) - end)  # what was cut is zero now

    def test_file_cut_mid_entry(self, tmp_path: Path) -> None:
        places = crashed(tmp_path, durable=3, unsynced=3, config=SMALL)
        path, offset, size = places[6]
        os.truncate(path, offset + size // 2)
        with open_store(tmp_path, SMALL) as store:
            assert_log(store, 5)
            assert store.recovery.cut_entries == 1
            assert store.recovery.cut_bytes == size // 2
            assert path.stat().st_size == SMALL.segment_bytes  # extended again, with zeros

    def test_zeroed_tail_with_index_ahead_of_data(self, tmp_path: Path) -> None:
        """The data pages of the last entries never reached the disk; their index records
        did: the records are cleared, nothing is served from them."""
        places = crashed(tmp_path, durable=4, unsynced=3, config=SMALL)
        path, offset, _ = places[6]
        with open(path, "r+b") as f:
            f.seek(offset)
            f.write(bytes(SMALL.segment_bytes - offset))
        with open_store(tmp_path, SMALL) as store:
            assert_log(store, 5)
            assert store.recovery.cut_entries == 0 and store.recovery.index_records_cleared == 2

    def test_stale_bytes_after_the_end_are_zeroed(self, tmp_path: Path) -> None:
        places = crashed(tmp_path, durable=4, unsynced=0, config=SMALL)
        path, offset, size = places[4]
        with open(path, "r+b") as f:
            f.seek(offset + size + 100)
            f.write(b"\x01" * 50)
        with open_store(tmp_path, SMALL) as store:
            assert_log(store, 4)
            assert store.recovery.cut_bytes == 150 and store.recovery.cut_entries == 0
            store.append(batch_of(5, 1, 1))
        with open_store(tmp_path, SMALL) as store:
            assert_log(store, 5)

    def test_missing_next_segment(self, tmp_path: Path) -> None:
        """The last segment's file is gone (its creation never reached the disk)."""
        places = crashed(tmp_path, durable=5, unsynced=10)
        last_path = places[15][0]
        first_lost = min(i for i, p in places.items() if p[0] == last_path)
        assert first_lost > 6
        last_path.unlink()
        with open_store(tmp_path) as store:
            assert_log(store, first_lost - 1)

    def test_short_segment_file(self, tmp_path: Path) -> None:
        """A segment created but never extended (no preallocation) reads as zeros."""
        config = StoreConfig(segment_bytes=4096, index_records_per_file=8, preallocate=False)
        store = open_store(tmp_path, config)
        store.append(batch_of(1, 1, 3, size=700))  # past half: the next segment is prepared
        store.prepare_next_segment()
        store.abandon()
        os.truncate(segment_files(tmp_path)[1], 0)
        os.truncate(segment_files(tmp_path)[0], 3 * 744)  # exactly the three entries
        with open_store(tmp_path, config) as store:
            assert_log(store, 3, size=700)


class TestDamageIsRefused:
    def test_middle_entry_corrupted(self, tmp_path: Path) -> None:
        places = crashed(tmp_path, durable=0, unsynced=20)
        path, offset, _ = places[8]
        flip(path, offset + HEADER + 1)
        with pytest.raises(CorruptEntry) as info:
            open_store(tmp_path)
        error = info.value
        position = int(path.name) + offset
        assert error.segment == f"data/{path.name}" and error.position == position
        assert "body crc mismatch" in error.reason and "a valid entry follows" in error.reason
        assert str(error).startswith(f"corrupt entry at position {position} in data/{path.name}")
        with open_store(tmp_path, StoreConfig(4096, 8, repair=True)) as store:
            assert_log(store, 7)
            assert store.recovery.cut_entries >= 12

    def test_middle_header_corrupted_found_through_the_index(self, tmp_path: Path) -> None:
        places = crashed(tmp_path, durable=0, unsynced=20)
        path, offset, _ = places[8]
        flip(path, offset + 5)  # the size field: the walk cannot step over this entry
        with pytest.raises(CorruptEntry, match="header crc mismatch; a valid entry follows"):
            open_store(tmp_path)

    def test_damage_after_the_checkpoint_without_index_is_a_torn_tail(self, tmp_path: Path) -> None:
        """With its index records gone too, damage past the checkpoint's durable index looks
        like what a process killed mid-copy leaves (a hole, then whole entries): it is cut.
        The checkpoint still guards everything before it."""
        places = crashed(tmp_path, durable=5, unsynced=15)
        path, offset, _ = places[8]
        flip(path, offset + 5)
        for index_file in index_files(tmp_path):
            index_file.unlink()
        with open_store(tmp_path) as store:
            assert_log(store, 7)

    def test_missing_middle_segment(self, tmp_path: Path) -> None:
        places = crashed(tmp_path, durable=0, unsynced=20)
        path = places[8][0]
        path.unlink()
        with pytest.raises(CorruptEntry, match=f"segment data/{path.name} is missing"):
            open_store(tmp_path)

    def test_damage_below_the_checkpoint_is_refused_even_at_the_end(self, tmp_path: Path) -> None:
        """The last entry was durable per the checkpoint: no torn write can explain it."""
        with open_store(tmp_path) as store:
            store.append(batch_of(1, 1, 10))
            path, offset, _ = where(store, 10)
        flip(path, offset + HEADER)
        with pytest.raises(CorruptEntry, match="durable per the checkpoint"):
            open_store(tmp_path)
        with open_store(tmp_path, StoreConfig(4096, 8, repair=True)) as store:
            assert_log(store, 9)

    def test_reads_check_what_recovery_trusted(self, tmp_path: Path) -> None:
        """An entry below the walk start that rots later is refused when read, not served."""
        with open_store(tmp_path) as store:
            store.append(batch_of(1, 1, 10))
            path, offset, _ = where(store, 3)
        flip(path, offset + HEADER)
        with open_store(tmp_path) as store:
            assert store.recovery.entries_checked == 0  # clean close: nothing to walk
            with pytest.raises(CorruptEntry, match="body crc mismatch"):
                store.get(3)
            with pytest.raises(CorruptEntry):
                store.read(1, 10, 10**6)
            assert store.get(4).body == body(4, 1)


class TestIndexRebuilt:
    def test_deleted_index_files_are_rebuilt(self, tmp_path: Path) -> None:
        with open_store(tmp_path) as store:
            store.append(batch_of(1, 1, 30))
        for index_file in index_files(tmp_path):
            index_file.unlink()
        with open_store(tmp_path) as store:
            assert_log(store, 30)
            assert store.recovery.index_records_rebuilt == 30
            assert store.recovery.walked_from_index == 1

    def test_index_behind_the_data(self, tmp_path: Path) -> None:
        """Records of the last entries never reached the disk; the walk rewrites them."""
        places = crashed(tmp_path, durable=5, unsynced=3, config=SMALL)
        del places
        index_path = index_files(tmp_path)[0]
        with open(index_path, "r+b") as f:
            f.seek(6 * 32)
            f.write(bytes(2 * 32))
        with open_store(tmp_path, SMALL) as store:
            assert_log(store, 8)
            assert store.recovery.index_records_rebuilt == 2

    def test_wrong_record_is_rewritten(self, tmp_path: Path) -> None:
        crashed(tmp_path, durable=5, unsynced=3, config=SMALL)
        index_path = index_files(tmp_path)[0]
        flip(index_path, 6 * 32 + 20)  # the term of index 7
        with open_store(tmp_path, SMALL) as store:
            assert_log(store, 8)
            assert store.recovery.index_records_rebuilt == 1

    def test_stray_files_are_ignored(self, tmp_path: Path) -> None:
        with open_store(tmp_path) as store:
            store.append(batch_of(1, 1, 3))
        (tmp_path / "dledger" / "data" / (file_name(0) + ".tmp")).write_bytes(b"x")
        with open_store(tmp_path) as store:
            assert_log(store, 3)


class TestStateFiles:
    def test_missing_meta_with_data_is_refused(self, tmp_path: Path) -> None:
        with open_store(tmp_path) as store:
            store.append(batch_of(1, 1, 3))
        (tmp_path / "dledger" / "meta").unlink()
        with pytest.raises(CorruptStateFile, match="missing, but the store holds data files"):
            open_store(tmp_path)

    def test_corrupt_checkpoint_is_refused_unless_repairing(self, tmp_path: Path) -> None:
        with open_store(tmp_path) as store:
            store.append(batch_of(1, 1, 3))
        checkpoint = tmp_path / "dledger" / "checkpoint"
        flip(checkpoint, 13)
        with pytest.raises(CorruptStateFile, match="crc mismatch"):
            open_store(tmp_path)
        with open_store(tmp_path, StoreConfig(4096, 8, repair=True)) as store:
            assert_log(store, 3)
            assert store.recovery.walked_from_index == 1
