"""LogStore behaviour through its API: positions, reads, flush tickets and the durable
index, checkpoint, segment preparation, reset, and the bound on open files."""

from __future__ import annotations

import errno
import os
from collections.abc import Sequence
from pathlib import Path

import attrs
import pytest

from dledger import limits
from dledger.log.errors import CorruptEntry, IndexOutOfRange, StoreLocked
from dledger.log.index_file import RECORD
from dledger.log.meta import Checkpoint
from dledger.log.segment import entry_position, write_at
from dledger.log.store import FlushPolicy, StoreConfig
from dledger.raft.entries import EntryBatch, EntryId, EntryKind, LogStart
from tests.log.helpers import SMALL, TINY, batch_of, body, open_store, segment_files

DEADLINE_S = 10.0  # how long a test thread may take before it counts as stuck

ASYNC_500_MS_4_PAGES = StoreConfig(
    segment_bytes=1 << 20, flush=FlushPolicy.ASYNC_FLUSH, flush_interval_ms=500, flush_least_pages=4
)


class TestPositions:
    def test_positions_are_the_entries_positions_across_index_files(self, tmp_path: Path) -> None:
        with open_store(tmp_path) as store:
            for index in range(1, 40):
                store.append(batch_of(index, 1, 1))
            assert store.positions(1, 39) == [store.get(i).position for i in range(1, 39 + 1)]
            assert store.positions(7, 7) == [store.get(7).position]
            assert store.positions(1, 39) == store._reader.positions(1, 39)  # memory = disk

    def test_a_damaged_index_record_is_named_by_positions(self, tmp_path: Path) -> None:
        with open_store(tmp_path) as store:
            store.append(batch_of(1, 1, 20))
            reader = store._reader
            file = reader._index_file(9)
            position, _, term, size, kind, reserved = RECORD.unpack_from(file.mm, file.offset(9))
            RECORD.pack_into(file.mm, file.offset(9), position, 10, term, size, kind, reserved)
            # the store answers from the entries it holds in memory; the records are read, and
            # checked, for what it no longer holds (and after every open)
            with pytest.raises(CorruptEntry, match="index record for index 9 holds index 10"):
                reader.positions(1, 20)
            RECORD.pack_into(file.mm, file.offset(9), position, 9, term, 3, kind, reserved)
            with pytest.raises(
                CorruptEntry, match="index record for index 9 holds index 9, size 3"
            ):
                reader.positions(5, 12)

    def test_positions_follow_the_blank_record_rule(self, tmp_path: Path) -> None:
        """Each entry starts where entry_position says: every replica computes the same."""
        with open_store(tmp_path) as store:
            expected = 0
            for index in range(1, 60):
                size = limits.ENTRY_HEADER_BYTES + len(body(index, 1))
                position = entry_position(store.next_position, size, TINY.segment_bytes)
                assert position == entry_position(expected, size, TINY.segment_bytes)
                store.append(batch_of(index, 1, 1))
                assert store.get(index).position == position
                expected = position + size
                assert store.next_position == expected

    def test_same_entries_same_positions_in_any_batching(self, tmp_path: Path) -> None:
        """Positions depend on the entries, not on how they were batched or flushed."""
        entries = batch_of(1, 1, 40)
        with open_store(tmp_path / "a") as a, open_store(tmp_path / "b") as b:
            a.append(entries)
            for k in range(40):
                b.append(entries.slice(k + 1, k + 1))
                if k % 7 == 0:
                    b.flush()
            assert [a.get(i).position for i in range(1, 41)] == [
                b.get(i).position for i in range(1, 41)
            ]
            assert a.next_position == b.next_position

    def test_segments_are_aligned_and_named_by_position(self, tmp_path: Path) -> None:
        with open_store(tmp_path) as store:
            store.append(batch_of(1, 1, 30))
        names = [p.name for p in segment_files(tmp_path)]
        assert names[0] == "00000000000000000000"
        assert all(int(n) % TINY.segment_bytes == 0 for n in names)
        assert all(p.stat().st_size == TINY.segment_bytes for p in segment_files(tmp_path))


class TestReads:
    def test_read_stops_at_the_byte_budget_but_returns_one(self, tmp_path: Path) -> None:
        with open_store(tmp_path, SMALL) as store:
            store.append(batch_of(1, 1, 10, size=100))
            assert len(store.read(1, 10, 0)) == 1
            assert len(store.read(1, 10, 250)) == 2
            assert len(store.read(1, 10, 300)) == 3
            assert len(store.read(3, 10, 10**9)) == 8

    def test_term_at_covers_start_prev_and_last(self, tmp_path: Path) -> None:
        with open_store(tmp_path) as store:
            assert store.term_at(0) == 0
            store.append(batch_of(1, 2, 3))
            store.append(batch_of(4, 5, 2))
            assert [store.term_at(i) for i in range(0, 6)] == [0, 2, 2, 2, 5, 5]

    def test_get_returns_stored_fields(self, tmp_path: Path) -> None:
        with open_store(tmp_path) as store:
            store.append(batch_of(1, 3, 2, size=10))
            entry = store.get(2)
            assert (entry.index, entry.term, entry.kind, entry.size) == (2, 3, 0, 54)
            assert entry.body == body(2, 3, 10) and entry.position == 54


class TestDurability:
    def test_nothing_is_durable_before_a_flush(self, tmp_path: Path) -> None:
        with open_store(tmp_path) as store:
            store.append(batch_of(1, 1, 5))
            assert store.durable_index == 0
            assert store.flush() == 5
            assert store.begin_flush() is None  # nothing dirty any more

    def test_ticket_covers_what_was_written_when_it_began(self, tmp_path: Path) -> None:
        with open_store(tmp_path) as store:
            store.append(batch_of(1, 1, 5))
            ticket = store.begin_flush()
            assert ticket is not None
            store.append(batch_of(6, 1, 5))  # while the fsync runs in a thread
            ticket.run()
            assert store.complete_flush(ticket) == 5
            assert store.flush() == 10

    def test_truncation_caps_a_ticket_begun_before_it(self, tmp_path: Path) -> None:
        with open_store(tmp_path) as store:
            store.append(batch_of(1, 1, 10))
            old = store.begin_flush()
            assert old is not None
            store.truncate_after(4)
            assert store.durable_index == 0
            store.append(batch_of(5, 2, 3))  # new entries 5..7 of term 2
            old.run()
            assert store.complete_flush(old) == 4  # its fsync never saw the new 5..7
            new = store.begin_flush()
            assert new is not None
            new.run()
            assert store.complete_flush(new) == 7

    def test_truncation_lowers_durable_at_once(self, tmp_path: Path) -> None:
        with open_store(tmp_path) as store:
            store.append(batch_of(1, 1, 10))
            store.flush()
            store.truncate_after(3)
            assert store.durable_index == 3
            assert store.flush() == 3  # the zeroed bytes are synced; nothing new to claim

    def test_a_later_ticket_resyncs_files_of_one_in_flight(self, tmp_path: Path) -> None:
        """Finishing first must not let a ticket claim what another is still syncing."""
        with open_store(tmp_path) as store:
            store.append(batch_of(1, 1, 3))
            first = store.begin_flush()
            store.append(batch_of(4, 1, 1))
            second = store.begin_flush()
            assert first is not None and second is not None
            assert len(second.fds) >= len(first.fds)
            second.run()
            assert store.complete_flush(second) == 4
            first.run()
            assert store.complete_flush(first) == 4

    def test_flush_due(self, tmp_path: Path) -> None:
        with open_store(tmp_path) as store:
            assert not store.flush_due(0)
            store.append(batch_of(1, 1, 1))
            assert store.flush_due(0)  # SYNC_FLUSH: anything dirty
        with open_store(tmp_path / "async", ASYNC_500_MS_4_PAGES) as store:
            # every flush_interval_ms or flush_least_pages, whichever comes first
            store.append(batch_of(1, 1, 1, size=100))
            assert not store.flush_due(1000)  # the interval starts now
            assert not store.flush_due(1499)  # less than 4 pages dirty
            assert store.flush_due(1500)  # the interval passed: whatever is dirty
            store.flush()
            assert not store.flush_due(1500)  # nothing dirty
            store.append(batch_of(2, 1, 20, size=1000))  # > 4 pages dirty
            assert store.flush_wanted
            assert store.flush_due(1501)  # at once, without waiting for the interval
            store.flush()
            assert not store.flush_wanted

    def test_flush_due_timed(self, tmp_path: Path) -> None:
        with open_store(tmp_path, attrs.evolve(ASYNC_500_MS_4_PAGES, flush_timed=True)) as store:
            # RocketMQ's timed flush: at most once per interval, and then only when at least
            # flush_least_pages are dirty, or whatever is dirty after the thorough interval
            store.append(batch_of(1, 1, 1, size=100))
            assert not store.flush_due(1000)  # the interval starts now
            assert not store.flush_due(1500)  # interval over, but less than 4 pages dirty
            assert store.flush_due(1000 + limits.FLUSH_THOROUGH_INTERVAL_MS)
            store.flush()
            store.append(batch_of(2, 1, 20, size=1000))  # > 4 pages dirty
            assert not store.flush_due(20_000)  # the interval starts now
            assert not store.flush_due(20_499)
            assert store.flush_due(20_500)


class TestCheckpoint:
    def test_round_trip_with_durable_index(self, tmp_path: Path) -> None:
        with open_store(tmp_path) as store:
            assert store.read_checkpoint() == Checkpoint()
            store.append(batch_of(1, 1, 5))
            store.flush()
            store.write_checkpoint(4, 3)
            ck = store.read_checkpoint()
            assert (ck.commit_index, ck.applied_index, ck.durable_index) == (4, 3, 5)
        with open_store(tmp_path) as store:
            ck = store.read_checkpoint()
            assert (ck.commit_index, ck.applied_index, ck.durable_index) == (4, 3, 5)

    def test_truncation_below_it_lowers_its_durable_index(self, tmp_path: Path) -> None:
        with open_store(tmp_path) as store:
            store.append(batch_of(1, 1, 8))
            store.flush()
            store.write_checkpoint(2, 2)
            store.truncate_after(5)
            assert store.read_checkpoint().durable_index == 5
            store.abandon()  # crash: the checkpoint on disk already says 5
        with open_store(tmp_path) as store:
            assert store.read_checkpoint().durable_index == 5 and store.last_index == 5


class TestPrepare:
    def test_rollover_takes_the_prepared_segment(self, tmp_path: Path) -> None:
        with open_store(tmp_path) as store:
            store.append(batch_of(1, 1, 1, size=100))
            assert not store.segment_prepare_due  # not before the segment is half written
            store.prepare_next_segment()
            assert len(segment_files(tmp_path)) == 1
            store.truncate_after(0)
            store.append(batch_of(1, 1, 1, size=2100))  # 2144 of 4096 bytes
            assert store.segment_prepare_due
            store.prepare_next_segment()
            assert not store.segment_prepare_due
            assert len(segment_files(tmp_path)) == 2  # the current one and the prepared one
            prepared = segment_files(tmp_path)[1].stat().st_ino
            store.append(batch_of(2, 1, 2, size=3000))  # rolls into it
            assert segment_files(tmp_path)[1].stat().st_ino == prepared
            assert store.segment_prepare_due  # and the one after it is next
            assert [store.get(i).body for i in (2, 3)] == [body(2, 1, 3000), body(3, 1, 3000)]

    def test_the_flush_after_rolling_into_a_prepared_segment_syncs_its_name(
        self, tmp_path: Path
    ) -> None:
        with open_store(tmp_path) as store:
            store.append(batch_of(1, 1, 1, size=2100))  # past half of the segment
            store.prepare_next_segment()
            ticket = store.begin_flush()
            assert ticket is not None
            ticket.run()
            store.complete_flush(ticket)
            store.append(batch_of(2, 1, 1, size=3000))  # rolls into the prepared segment
            ticket = store.begin_flush()
            assert ticket is not None and segment_files(tmp_path)[1].parent in ticket.directories
            ticket.run()
            store.complete_flush(ticket)
        with open_store(tmp_path) as store:
            assert store.last_index == 2 and store.get(2).body == body(2, 1, 3000)

    def test_prepared_segment_left_by_a_crash_is_removed(self, tmp_path: Path) -> None:
        store = open_store(tmp_path)
        store.append(batch_of(1, 1, 1, size=2100))  # past half of the segment
        store.prepare_next_segment()
        assert len(segment_files(tmp_path)) == 2
        store.abandon()
        with open_store(tmp_path) as store:
            assert len(segment_files(tmp_path)) == 1 and store.last_index == 1


class TestWriteAt:
    def test_a_short_write_goes_on_where_it_stopped(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """pwritev may take part of what it is given (a disk filling up); write_at writes the
        rest, and the next call raises the kernel's error."""
        real_pwritev = os.pwritev

        def short_pwritev(fd: int, buffers: Sequence[bytes], offset: int) -> int:
            return real_pwritev(fd, [b"".join(buffers)[:5]], offset)

        monkeypatch.setattr(os, "pwritev", short_pwritev)
        path = tmp_path / "file"
        fd = os.open(path, os.O_RDWR | os.O_CREAT)
        try:
            write_at(fd, (b"0123456789", b"abc"), 3)
        finally:
            os.close(fd)
        assert path.read_bytes() == b"\0\0\0" + b"0123456789abc"

    def test_a_write_that_takes_nothing_raises_instead_of_spinning(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setattr(os, "pwritev", lambda fd, buffers, offset: 0)
        monkeypatch.setattr(os, "pwrite", lambda fd, data, offset: 0)
        fd = os.open(tmp_path / "file", os.O_RDWR | os.O_CREAT)
        try:
            with pytest.raises(OSError) as raised:
                write_at(fd, (b"data",), 0)
        finally:
            os.close(fd)
        assert raised.value.errno == errno.ENOSPC


class TestReset:
    def test_restart_after_a_gap_mid_segment(self, tmp_path: Path) -> None:
        with open_store(tmp_path) as store:
            store.append(batch_of(1, 1, 5))
            start = LogStart(EntryId(100, 3), 5 * TINY.segment_bytes + 1000)
            store.reset(start)
            assert (store.first_index, store.last_index, store.last_term) == (101, 100, 3)
            assert store.durable_index == 100 and store.next_position == start.position
            store.append(batch_of(101, 3, 3, size=10))
            assert store.get(101).position == start.position
        with open_store(tmp_path) as store:
            assert store.start == start and store.last_index == 103
            assert store.get(103).body == body(103, 3, 10)
        assert [p.name for p in segment_files(tmp_path)] == ["00000000000000020480"]


class TestOpenFiles:
    def test_more_segments_than_may_be_open(self, tmp_path: Path) -> None:
        """Old segments are closed to stay under SEGMENTS_OPEN_MAX; dirty ones synced first."""
        count = limits.SEGMENTS_OPEN_MAX * 2
        with open_store(tmp_path) as store:
            for index in range(1, count + 1):
                store.append(batch_of(index, 1, 1, size=3000))  # one segment each
            assert len(store._segments.opened()) <= limits.SEGMENTS_OPEN_MAX
            assert all(store.get(i).body == body(i, 1, 3000) for i in range(1, count + 1))
            assert store.flush() == count
        fds = len(os.listdir("/proc/self/fd"))
        with open_store(tmp_path) as store:
            store.read(1, count, 10**9)
            mapped = limits.SEGMENTS_OPEN_MAX + limits.INDEX_FILES_OPEN_MAX
            assert len(os.listdir("/proc/self/fd")) <= fds + 2 * mapped + 2  # mmap dups its fd


class TestLifecycle:
    def test_abort_marker_while_open(self, tmp_path: Path) -> None:
        store = open_store(tmp_path)
        assert (tmp_path / "dledger" / "abort").exists()
        store.close()
        assert not (tmp_path / "dledger" / "abort").exists()
        store.close()  # twice is fine

    def test_second_open_is_refused(self, tmp_path: Path) -> None:
        with open_store(tmp_path), pytest.raises(StoreLocked, match="open elsewhere"):
            open_store(tmp_path)
        open_store(tmp_path).close()  # the lock went with the first store


class TestReadMeta:
    def test_matches_the_entries_across_index_files(self, tmp_path: Path) -> None:
        """read_meta slices index records in C; it must agree with reading each entry."""
        with open_store(tmp_path, TINY) as store:
            index = 1
            for term, count in ((1, 5), (2, 9), (3, 7)):
                store.append(batch_of(index, term, count, size=10 * term))
                index += count
            store.append(EntryBatch(index, [3], [EntryKind.NOOP.value], [b""]))
            last = store.last_index
            for lo, hi in ((1, last), (2, 2), (4, last - 1), (last, last)):
                terms, kinds, sizes = store.read_meta(lo, hi)
                entries = [store.get(i) for i in range(lo, hi + 1)]
                assert terms == [e.term for e in entries]
                assert kinds == [e.kind for e in entries]
                assert sizes == [e.size for e in entries]
                # what an applier that reads bodies feeds its digest instead: the same
                batch = store.read(lo, hi, 1 << 30)
                assert (list(batch.terms), list(batch.kinds)) == (terms, kinds)
                assert [limits.ENTRY_HEADER_BYTES + len(b) for b in batch.payloads] == sizes

    def test_out_of_range(self, tmp_path: Path) -> None:
        with open_store(tmp_path) as store:
            store.append(batch_of(1, 1, 3))
            with pytest.raises(IndexOutOfRange):
                store.read_meta(1, 4)
