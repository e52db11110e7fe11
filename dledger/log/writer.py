"""The write side of a store: where the next entry goes, and every change made to the files.

The append path is the hot path of the whole broker, so it works on runs of entries, not on
entries: one placement pass (`accumulate` plus a `bisect` where a segment ends), one encoded
buffer written with one pwrite per run, one buffer of index records per index file. Each step
is a C-level map; the Python bytecode per entry is a few list slots. Reads go through the
files' mappings, which on Linux show what pwrite wrote (one page cache).
"""

from __future__ import annotations

import threading
from bisect import bisect_right
from collections.abc import Sequence
from itertools import accumulate, islice, repeat

from dledger.log.durability import Durability
from dledger.log.entry import BLANK_BYTES_MIN, encode_blank, encode_run, entry_pieces
from dledger.log.index_file import RECORD, IndexFile, IndexFiles
from dledger.log.layout import StorePaths, index_label, segment_label
from dledger.log.segment import Segment, SegmentFiles, write_at, zero
from dledger.log.state_file import fsync_dir
from dledger.raft.entries import EntryBatch


class LogWriter:
    """Appends, truncates and deletes; owns the write position and the prepared segment.

    Runs on the store owner's thread, except prepare_next_segment, which runs in a worker
    thread and shares only `_prepared` with the rest, under `_prepare_lock`.
    """

    def __init__(
        self,
        paths: StorePaths,
        segments: SegmentFiles,
        index: IndexFiles,
        durability: Durability,
        *,
        preallocate: bool,
    ) -> None:
        self.paths = paths
        self.segments = segments
        self.index = index
        self.durability = durability
        self.preallocate = preallocate
        self.segment_bytes = segments.segment_bytes
        self.write_position = 0
        self._segment: Segment | None = None  # the one holding write_position, once it exists
        self._index_file: IndexFile | None = None  # the one the next record goes to
        self._prepare_lock = threading.Lock()
        self._prepared: Segment | None = None
        self._closed = False

    def move_to(self, position: int) -> None:
        """The next entry goes to `position` (after recovery, a truncation or a reset)."""
        self.write_position = position
        self._segment = None
        self._index_file = None

    # --- appending ----------------------------------------------------------------------------

    def append(self, batch: EntryBatch, sizes: list[int]) -> list[int]:
        """Write `batch` (entry sizes given) at the write position; the caller checked it.
        Returns where each entry was written."""
        if len(sizes) == 1:
            position = self._append_one(batch, sizes[0])
            if position is not None:
                return [position]
        positions: list[int] = []
        done = 0
        while done < len(sizes):
            done = self._append_run(batch, sizes, done, positions)
        return positions

    def _append_one(self, batch: EntryBatch, size: int) -> int | None:
        """One entry that fits the current segment and index file: a few C calls, no run.
        Its position, or None (nothing written) when it needs the general path."""
        segment, file = self._segment, self._index_file
        position = self.write_position
        index = batch.first_index
        if segment is None or file is None or not file.first <= index <= file.last:
            return None
        offset = position - segment.base
        end = offset + size
        if end > self.segment_bytes - BLANK_BYTES_MIN and end != self.segment_bytes:
            return None
        term, kind = batch.terms[0], batch.kinds[0]
        write_at(segment.fd, entry_pieces(index, term, position, kind, batch.payloads[0]), offset)
        record = RECORD.pack(position, index, term, size, kind, 0)
        write_at(file.fd, (record,), (index - file.first) * RECORD.size)
        durability = self.durability
        durability.dirty.add(segment)
        durability.dirty_index.add(file)
        durability.dirty_bytes += size + RECORD.size
        self.write_position = position + size
        return position

    def _append_run(self, batch: EntryBatch, sizes: list[int], lo: int, written: list[int]) -> int:
        """Write entries lo.. that fit in the current segment, adding their positions to
        `written`; returns the first one left."""
        segment = self._segment_for_append()
        limit = segment.base + self.segment_bytes
        ends = list(accumulate(islice(sizes, lo, None), initial=self.write_position))
        fitting = len(ends) - 1
        last_end = ends[-1]
        if last_end > limit - BLANK_BYTES_MIN and last_end != limit:  # the blank-record rule
            fitting = bisect_right(ends, limit - BLANK_BYTES_MIN) - 1
            if fitting + 1 < len(ends) and ends[fitting + 1] == limit:
                fitting += 1
        durability = self.durability
        if fitting == 0:  # the next entry starts the next segment: blank out this one's tail
            offset = self.write_position - segment.base
            assert offset, (sizes[lo], self.segment_bytes)  # the store checked that all fit
            write_at(segment.fd, (encode_blank(limit - self.write_position),), offset)
            durability.dirty.add(segment)
            durability.dirty_bytes += BLANK_BYTES_MIN
            self.write_position = limit
            return lo
        hi = lo + fitting
        if lo == 0 and hi == len(sizes):
            terms, kinds, payloads, run_sizes = batch.terms, batch.kinds, batch.payloads, sizes
            positions = ends[:-1]
        else:
            terms, kinds = batch.terms[lo:hi], batch.kinds[lo:hi]
            payloads, run_sizes = batch.payloads[lo:hi], sizes[lo:hi]
            positions = ends[:fitting]
        first_index = batch.first_index + lo
        data = encode_run(first_index, terms, kinds, payloads, positions, run_sizes)
        write_at(segment.fd, (data,), self.write_position - segment.base)
        self._write_records(first_index, positions, terms, run_sizes, kinds)
        written += positions
        durability.dirty.add(segment)
        durability.dirty_bytes += len(data)
        self.write_position = ends[fitting]
        return hi

    def _write_records(
        self,
        first_index: int,
        positions: Sequence[int],
        terms: Sequence[int],
        sizes: Sequence[int],
        kinds: Sequence[int],
    ) -> None:
        count = len(positions)
        done = 0
        while done < count:
            index = first_index + done
            file = self._index_file
            if file is None or not file.first <= index <= file.last:
                file, created = self.index.get_or_create(index)
                self._index_file = file
                self.index.open_files.pinned = file
                if created:
                    self.durability.dirty_directories.add(self.paths.index)
            take = min(count - done, file.last - index + 1)
            if take == count:
                columns = [positions, terms, sizes, kinds]
            else:
                columns = [c[done : done + take] for c in (positions, terms, sizes, kinds)]
            records = b"".join(
                map(
                    RECORD.pack,
                    columns[0],
                    range(index, index + take),
                    columns[1],
                    columns[2],
                    columns[3],
                    repeat(0, take),
                )
            )
            write_at(file.fd, (records,), file.offset(index))
            self.durability.dirty_index.add(file)
            self.durability.dirty_bytes += len(records)
            done += take

    def _segment_for_append(self) -> Segment:
        """The segment holding the write position, created (or taken from prepare) if new."""
        segment = self._segment
        position = self.write_position
        if segment is not None and segment.base <= position < segment.base + self.segment_bytes:
            return segment
        base = self.segments.base_of(position)
        with self._prepare_lock:
            prepared, self._prepared = self._prepared, None
            new = base not in self.segments
            if new and prepared is not None and prepared.base == base:
                self.segments.adopt(prepared)
                segment = prepared
            else:
                if prepared is not None:
                    _discard(prepared)
                segment = self.segments.create(base) if new else self.segments.get(base)
            if new:  # its name is made durable by the flush that covers its first entries
                self.durability.dirty_directories.add(self.paths.data)
        self._segment = segment
        self.segments.open_files.pinned = segment
        return segment

    # --- preparing the next segment -------------------------------------------------------

    def _prepare_target(self) -> int | None:
        """The segment to prepare: the one holding the write position if it does not exist
        yet, else the next one once the current one is half written (preparing reserves a
        whole segment's blocks, so it waits until the log is on its way there)."""
        base = self.segments.base_of(self.write_position)
        if base not in self.segments:
            return base
        if self.write_position - base < self.segment_bytes // 2:
            return None
        return base + self.segment_bytes

    @property
    def segment_prepare_due(self) -> bool:
        if self._closed:
            return False
        target = self._prepare_target()
        if target is None:
            return False
        prepared = self._prepared
        return (prepared is None or prepared.base != target) and target not in self.segments

    def prepare_next_segment(self) -> None:
        """Blocking, for a worker thread: create (and preallocate) the segment the log rolls
        into next, so the append that reaches it does not pay for the open, the fallocate
        and the mmap (about a millisecond for 1 GiB) on the event loop.

        Its pages are not read in ahead: appends write with pwrite, which allocates page cache
        as it goes, and on this VM that costs a tenth of faulting fresh pages in through the
        mapping (docs/decisions.md, "Appends by pwrite, not through the mapping").
        """
        with self._prepare_lock:
            if self._closed:
                return
            target = self._prepare_target()
            if target is None:
                return
            if self._prepared is not None:
                if self._prepared.base == target:
                    return
                _discard(self._prepared)
                self._prepared = None
            if target in self.segments:
                return
            path = self.paths.segment(target)
            self._prepared = Segment.create(
                path, target, self.segment_bytes, preallocate=self.preallocate
            )

    # --- truncating and deleting ------------------------------------------------------------

    def truncate(self, index: int, position: int, old_last: int) -> None:
        """Entries after `index` go: zero their bytes from `position` (where entry index+1
        started) to the old write position, delete later segments, clear their records."""
        # Records first: a process killed while zeroing must not leave a record pointing at an
        # entry behind a zeroed hole (recovery would take the hole for damage).
        for first in [f for f in self.index.firsts if f > index]:
            self.delete_index_file(first)
        file = self.index.find(index + 1)
        if file is not None:
            file.clear(index + 1, old_last)
            self.durability.dirty.add(file)
        old_end = self.write_position
        base = self.segments.base_of(position)
        for later in [b for b in self.segments.bases if b > base]:
            self.delete_segment(later)
        if base in self.segments and old_end > position:
            segment = self.segments.get(base)
            stop = min(old_end, base + self.segment_bytes)
            zero(segment.mm, position - base, stop - base)
            self.durability.dirty.add(segment)
            self.durability.dirty_bytes += stop - position
        self.move_to(position)

    def delete_segment(self, base: int) -> str:
        self.durability.forget(self.segments.get(base))
        self.segments.delete(base)
        self.durability.dirty_directories.add(self.paths.data)
        return segment_label(base)

    def delete_index_file(self, first: int) -> str:
        file = self.index.find(first)
        assert file is not None, first
        self.durability.forget(file)
        self.index.delete(first)
        self.durability.dirty_directories.add(self.paths.index)
        if self._index_file is file:
            self._index_file = None
        return index_label(first)

    def delete_all_index_files(self) -> None:
        """Durably: a reset's first step (the index is derived; the data still holds the log)."""
        for first in list(self.index.firsts):
            self.delete_index_file(first)
        fsync_dir(self.paths.index)

    def delete_all_segments(self) -> None:
        """Durably, with any prepared segment: a reset's last step."""
        with self._prepare_lock:
            if self._prepared is not None:
                _discard(self._prepared)
                self._prepared = None
        for base in list(self.segments.bases):
            self.delete_segment(base)
        fsync_dir(self.paths.data)

    def close(self, *, remove_prepared: bool = True) -> None:
        with self._prepare_lock:
            self._closed = True
            if self._prepared is not None:
                if remove_prepared:
                    _discard(self._prepared)
                else:
                    self._prepared.close()
                self._prepared = None
        self.segments.close()
        self.index.close()


def _discard(segment: Segment) -> None:
    """Close and remove a prepared segment the log did not roll into."""
    segment.close()
    segment.path.unlink(missing_ok=True)
