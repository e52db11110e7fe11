"""LogStore: the replicated log on disk, behind the RaftLog interface the core reads through.

One object, used from one thread (the node's trio loop), except for the blocking calls meant
for a worker thread: `FlushTicket.run` (fsync), `prepare_next_segment` and
`write_checkpoint`. Appends are synchronous copies into mmap'd segments; durability is
reported separately, through `durable_index`, once a flush ticket has synced what they wrote.

Files, formats and recovery: docs/formats.md and docs/log-store.md. This module is past
~400 lines because it is the facade: every public operation's contract (what it promises
about durability, what it raises) is written here, and the work is done by the modules it
calls (writer, reader, recovery, durability, retention).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterable
from datetime import datetime
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

import attrs

from dledger import limits
from dledger.log import retention
from dledger.log.config import FlushPolicy, StoreConfig
from dledger.log.durability import Durability, FlushTicket
from dledger.log.entry import BLANK_BYTES_MIN, WITH_HEADER
from dledger.log.errors import (
    BelowFirstIndex,
    Compacted,
    CorruptStateFile,
    EntryTooLarge,
    IndexOutOfRange,
)
from dledger.log.index_file import IndexFiles
from dledger.log.layout import StorePaths, lock_store
from dledger.log.meta import Checkpoint, Meta, now_ms, open_meta, read_checkpoint, write_meta
from dledger.log.meta import write_checkpoint as write_checkpoint_file
from dledger.log.page_cache import CacheTail, Run
from dledger.log.reader import EntryReader, StoredEntry
from dledger.log.recent import RecentAppends
from dledger.log.recovery import RecoveryReport, recover
from dledger.log.segment import SegmentFiles
from dledger.log.state_file import fsync_dir
from dledger.log.writer import LogWriter
from dledger.raft.entries import EntryBatch, EntryId, LogStart

if TYPE_CHECKING:
    from dledger.raft.storage import RaftLog

__all__ = [
    "Checkpoint",
    "FlushPolicy",
    "FlushTicket",
    "LogStore",
    "RecoveryReport",
    "StoreConfig",
    "StoredEntry",
]


class LogStore:
    """The on-disk log of one replica; satisfies dledger.raft.storage.RaftLog."""

    def __init__(self, paths: StorePaths, config: StoreConfig, meta: Meta, lock_fd: int) -> None:
        """Use LogStore.open."""
        self.paths = paths
        self.config = config
        self._meta = meta
        self._lock_fd = lock_fd
        self.segment_bytes = meta.segment_bytes
        # An entry of segment_bytes - 7 .. - 1 bytes fits no segment (it would leave 1-7 bytes).
        self.body_bytes_max = min(
            limits.ENTRY_BODY_BYTES_MAX,
            self.segment_bytes - limits.ENTRY_HEADER_BYTES - BLANK_BYTES_MIN,
        )
        self._segments = SegmentFiles(
            paths.data, self.segment_bytes, preallocate=config.preallocate
        )
        self._index = IndexFiles(
            paths.index, meta.index_records_per_file, preallocate=config.preallocate
        )
        self._reader = EntryReader(self._segments, self._index)
        self._recent = RecentAppends(limits.RECENT_APPENDS_BYTES_MAX)
        self._durability = Durability(meta.start.prev.index)
        self._writer = LogWriter(
            paths, self._segments, self._index, self._durability, preallocate=config.preallocate
        )
        self._start = meta.start
        self._last_index = meta.start.prev.index
        self._last_term = meta.start.prev.term
        self._checkpoint = Checkpoint()
        self._checkpoint_lock = threading.Lock()  # write_checkpoint may run in a worker thread
        self._interval_start_ms: int | None = None
        self._cache = CacheTail(self._segments, config.cache_tail_bytes)
        self._closed = False
        self.recovery = RecoveryReport(True, 0, 0, 0, 0, 0, 0)

    # --- opening and closing ----------------------------------------------------------------

    @classmethod
    def open(cls, store_dir: Path, config: StoreConfig, *, group: str, self_id: str) -> LogStore:
        """Open the store under `store_dir` (created when absent), recovering as needed.

        Raises StoreMismatch when it belongs to another group or replica or has another
        geometry, StoreLocked when another LogStore holds it, CorruptEntry when recovery finds
        damage it may not cut, CorruptStateFile for a bad meta or checkpoint.
        """
        paths = StorePaths(Path(store_dir))
        for directory in (paths.root, paths.data, paths.index):
            directory.mkdir(parents=True, exist_ok=True)
        lock_fd = lock_store(paths.root)
        try:
            meta = open_meta(paths, config, group=group, self_id=self_id)
            store = cls(paths, config, meta, lock_fd)
        except BaseException:
            os.close(lock_fd)
            raise
        try:
            store._recover()
        except BaseException:
            store._release()
            raise
        return store

    def _recover(self) -> None:
        began = time.perf_counter()
        clean = not self.paths.abort.exists()
        self.paths.abort.touch()
        try:
            checkpoint = read_checkpoint(self.paths.checkpoint)
        except CorruptStateFile:
            if not self.config.repair:
                raise
            checkpoint = None  # repair: walk the whole log instead of trusting it
        self._checkpoint = checkpoint or Checkpoint()
        self._segments.open_files.before_close = _sync  # recovery rewrites what it must
        self._index.open_files.before_close = _sync
        recovered = recover(
            self._segments,
            self._index,
            self._start,
            self._checkpoint.durable_index,
            clean_shutdown=clean,
            repair=self.config.repair,
        )
        self._last_index = recovered.last_index
        self._last_term = recovered.last_term
        self._writer.move_to(recovered.write_position)
        # What recovery read (and zeroed) may still be dirty in the page cache after a crash.
        for segment in self._segments.opened():
            os.fdatasync(segment.fd)
        for index_file in self._index.opened():
            os.fdatasync(index_file.fd)
        for directory in (self.paths.root, self.paths.data, self.paths.index):
            fsync_dir(directory)
        self._durability.durable_index = self._durability.index_durable_index = self._last_index
        self._segments.open_files.before_close = self._durability.sync_if_dirty
        self._index.open_files.before_close = self._durability.sync_if_dirty
        self.recovery = attrs.evolve(recovered.report, seconds=time.perf_counter() - began)

    def close(self) -> None:
        """Flush, record the durable index in the checkpoint, unmap, remove the abort marker."""
        if self._closed:
            return
        self.flush()
        with self._checkpoint_lock:
            ck = self._checkpoint
            self._write_checkpoint_locked(ck.commit_index, ck.applied_index)
        self._release()
        self.paths.abort.unlink()
        fsync_dir(self.paths.root)

    def abandon(self) -> None:
        """Let go of every file as a crash would: no flush, the abort marker stays. What was
        written stays in the page cache, so a reopen in this process sees it. For tests."""
        if not self._closed:
            self._release(crash=True)

    def _release(self, *, crash: bool = False) -> None:
        self._closed = True
        self._recent.clear()
        self._writer.close(remove_prepared=not crash)
        os.close(self._lock_fd)

    def __enter__(self) -> LogStore:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # --- the RaftLog interface and reads ----------------------------------------------------

    @property
    def start(self) -> LogStart:
        return self._start

    @property
    def first_index(self) -> int:
        return self._start.prev.index + 1

    @property
    def last_index(self) -> int:
        return self._last_index

    @property
    def last_term(self) -> int:
        return self._last_term

    @property
    def next_position(self) -> int:
        """Where the next entry goes, unless it does not fit in the rest of this segment:
        dledger.log.segment.entry_position gives the exact position for an entry size."""
        return self._writer.write_position

    def term_at(self, index: int) -> int:
        if index == self._last_index:
            return self._last_term
        prev = self._start.prev
        if index == prev.index:
            return prev.term
        assert prev.index < index <= self._last_index, (index, prev.index, self._last_index)
        return self._reader.record(index)[2]

    def get(self, index: int) -> StoredEntry:
        """The entry at `index`, checked against both CRCs and its index record: Compacted
        below the first index, IndexOutOfRange past the last, CorruptEntry if it fails."""
        self._check_range(index, index)
        return self._reader.get(index)

    def get_at(self, position: int) -> StoredEntry:
        """The entry starting at byte `position`, checked as `get` checks it: Compacted when
        retention deleted it, CorruptEntry when no entry of this log starts there."""
        if position < self._start.position:
            raise Compacted(self._start.prev.index, self.first_index)
        return self._reader.at(position, self.first_index, self._last_index)

    def first_index_at_or_after(self, position: int) -> int:
        """The first index whose entry starts at or after byte `position` (last_index + 1 when
        none does)."""
        if self._last_index < self.first_index:
            return self.first_index
        return self._reader.first_index_from(position, self.first_index, self._last_index)

    def positions(self, lo: int, hi: int) -> list[int]:
        """Byte positions of entries lo..hi (the broker's physical offsets, less the header)."""
        self._check_range(lo, hi)
        held = self._recent.positions(lo, hi)
        return held if held is not None else self._reader.positions(lo, hi)

    def read(self, lo: int, hi: int, bytes_max: int) -> EntryBatch:
        """Entries lo..hi, stopping before the body bytes pass `bytes_max` (at least one)."""
        self._check_range(lo, hi)
        held = self._recent.read(lo, hi, bytes_max)
        return held if held is not None else self._reader.read(lo, hi, bytes_max)

    def read_meta(self, lo: int, hi: int) -> tuple[list[int], list[int], list[int]]:
        """(terms, kinds, sizes) of entries lo..hi, from the index only (no bodies read)."""
        self._check_range(lo, hi)
        return self._reader.read_meta(lo, hi)

    def _check_range(self, lo: int, hi: int) -> None:
        if lo < self.first_index:
            raise Compacted(lo, self.first_index)
        if hi > self._last_index or lo > hi:
            raise IndexOutOfRange(hi if lo <= hi else lo, self.first_index, self._last_index)

    # --- writing ------------------------------------------------------------------------------

    def append(self, batch: EntryBatch) -> int:
        """Write `batch` after the last entry; returns the new last index. Not yet durable.

        EntryTooLarge (and nothing written) when a body exceeds body_bytes_max.
        """
        assert not self._closed
        assert batch.first_index == self._last_index + 1, (batch.first_index, self._last_index)
        payloads = batch.payloads
        if len(payloads) == 1:  # the common small case, without building lists
            length = len(payloads[0])
            if length > self.body_bytes_max:
                raise EntryTooLarge(length, self.body_bytes_max)
            term = batch.terms[0]
            assert self._last_term <= term, (self._last_term, term)
            positions = self._write(batch, [limits.ENTRY_HEADER_BYTES + length])
            self._last_index = batch.first_index
            self._last_term = term
            self._recent.add(batch, positions, [length])
            return self._last_index
        if not payloads:
            return self._last_index
        lengths = list(map(len, payloads))
        longest = max(lengths)
        if longest > self.body_bytes_max:
            raise EntryTooLarge(longest, self.body_bytes_max)
        terms = batch.terms
        assert self._last_term <= terms[0] <= terms[-1], (self._last_term, terms[0], terms[-1])
        positions = self._write(batch, list(map(WITH_HEADER, lengths)))
        self._last_index = batch.last_index
        self._last_term = terms[-1]
        self._recent.add(batch, positions, lengths)
        return self._last_index

    def _write(self, batch: EntryBatch, sizes: list[int]) -> list[int]:
        """All of the batch or none of it: an error part way (ENOSPC creating a segment)
        undoes the runs already written, so the log stays as it was. Where each entry went."""
        position = self._writer.write_position
        try:
            return self._writer.append(batch, sizes)
        except BaseException:
            self._writer.truncate(self._last_index, position, batch.last_index)
            raise

    def truncate_after(self, index: int) -> None:
        """Drop the entries after `index` (a Raft conflict): zero their bytes and clear their
        index records. BelowFirstIndex when `index` is below start.prev.index."""
        assert not self._closed
        prev = self._start.prev
        if index < prev.index:
            raise BelowFirstIndex(index, prev.index + 1)
        if index >= self._last_index:
            return
        self._recent.cut_after(index)
        with self._checkpoint_lock:  # first: the checkpoint must not vouch for what goes now
            ck = self._checkpoint
            if ck.durable_index > index:
                self._write_checkpoint_locked(ck.commit_index, ck.applied_index, durable=index)
        if index == prev.index:
            position, term = self._start.position, prev.term
        else:
            record = self._reader.record(index)
            position, term = record[0] + record[3], record[2]
        self._writer.truncate(index, position, self._last_index)
        self._last_index = index
        self._last_term = term
        self._durability.truncated(index)

    def reset(self, start: LogStart) -> None:
        """Drop every entry: the log restarts empty after start.prev, its next entry at
        start.position (a follower behind the leader's first retained index). Durable when
        it returns: meta names the new start and the old files are gone."""
        assert not self._closed
        offset = start.position % self.segment_bytes
        assert offset == 0 or self.segment_bytes - offset >= BLANK_BYTES_MIN, start
        assert start.prev.index >= 0 and start.prev.term >= 0, start
        with self._checkpoint_lock:
            ck = self._checkpoint
            if ck.durable_index > start.prev.index:
                self._write_checkpoint_locked(
                    ck.commit_index, ck.applied_index, durable=start.prev.index
                )
        self._recent.clear()
        # The index first: it is derived, so a crash now leaves the old log, re-indexed at
        # open. Then meta, the new start. Then the data: a crash before it is gone leaves
        # bytes that recovery finds are not the entry after the new start, and cuts.
        self._writer.delete_all_index_files()
        self._meta = attrs.evolve(self._meta, start=start)
        write_meta(self.paths.meta, self._meta)
        self._writer.delete_all_segments()
        self._start = start
        self._last_index = start.prev.index
        self._last_term = start.prev.term
        self._writer.move_to(start.position)
        self._durability.reset(start.prev.index)

    @property
    def segment_prepare_due(self) -> bool:
        """Whether prepare_next_segment has work: the next segment is not created yet."""
        return not self._closed and self._writer.segment_prepare_due

    def prepare_next_segment(self) -> None:
        """Blocking (run it in a worker thread): create and preallocate the segment the log
        rolls into next, then load its pages, so that rolling over costs the append path
        nothing. An append that rolls over while the pages are still loading takes the
        segment at once (LogWriter.prepare_next_segment)."""
        self._writer.prepare_next_segment()

    # --- flushing -----------------------------------------------------------------------------

    @property
    def durable_index(self) -> int:
        """Every entry through here is on disk (its data fsynced; its index record is rebuilt
        from the data by recovery if a power loss took it); never more than last_index."""
        return self._durability.durable_index

    @property
    def flushes(self) -> int:
        """Flush tickets completed so far (tests count group commits with it)."""
        return self._durability.flushes

    @property
    def fsyncs(self) -> int:
        return self._durability.fsyncs

    def begin_flush(self) -> FlushTicket | None:
        """Capture what is dirty (loop thread); None when nothing is."""
        return self._begin_flush(everything=False)

    def _begin_flush(self, *, everything: bool) -> FlushTicket | None:
        ticket = self._durability.begin(self._last_index, everything=everything)
        if ticket is not None:
            ticket.releases = self._cache.releases(
                self._writer.write_position, self._start.position
            )
        return ticket

    def left_cache(self, position: int) -> bool:
        """Whether the byte at `position` was let go of from the page cache (behind the tail)."""
        return position < self._cache.kept_from

    def cold_runs(self, spans: Iterable[tuple[int, int]]) -> list[Run]:
        """Loop thread: the parts of the byte spans [lo, hi) that left the page cache behind
        its tail, for `dledger.log.page_cache.read_in` to read in a worker thread before they
        are read here (empty, the common case, when all are in the tail)."""
        return self._cache.cold_runs(spans, self._start.position)

    def complete_flush(self, ticket: FlushTicket) -> int:
        """After ticket.run(): raise durable_index to what it covered; returns durable_index."""
        self._interval_start_ms = None
        return self._durability.complete(ticket)

    def flush(self) -> int:
        """begin + run + complete, blocking the caller, the index files included whatever
        their interval; returns durable_index."""
        ticket = self._begin_flush(everything=True)
        if ticket is not None:
            ticket.run()
            self.complete_flush(ticket)
        return self.durable_index

    def flush_due(self, now_ms: int) -> bool:
        """Whether a flush should start now.

        SYNC_FLUSH: anything dirty. ASYNC_FLUSH: once flush_least_pages are dirty, or whatever
        is dirty once flush_interval_ms passed since the last flush ("every N ms or M pages").
        With `flush_timed` (RocketMQ's flushCommitLogTimed) it is RocketMQ's timed flush
        instead: at most once per flush_interval_ms, and then only when flush_least_pages are
        dirty or FLUSH_THOROUGH_INTERVAL_MS passed."""
        if not self._durability.has_dirty():
            return False
        config = self.config
        if config.flush is FlushPolicy.SYNC_FLUSH:
            return True
        if self._interval_start_ms is None:
            self._interval_start_ms = now_ms
        waited_ms = now_ms - self._interval_start_ms
        enough = self.flush_wanted
        if not config.flush_timed:
            return enough or waited_ms >= config.flush_interval_ms
        if waited_ms < config.flush_interval_ms:
            return False
        return enough or waited_ms >= limits.FLUSH_THOROUGH_INTERVAL_MS

    @property
    def has_data_dirty(self) -> bool:
        """Entries (or file creations and removals) are written but not synced."""
        return self._durability.has_data_dirty()

    @property
    def index_sync_pending(self) -> bool:
        """Index records are written but not synced (a flush takes them along when due)."""
        return bool(self._durability.dirty_index)

    @property
    def flush_wanted(self) -> bool:
        """flush_least_pages are dirty: an ASYNC_FLUSH flusher should look now (the cheap test
        an append makes before waking it)."""
        return self._durability.dirty_pages >= self.config.flush_least_pages

    # --- checkpoint ---------------------------------------------------------------------------

    def read_checkpoint(self) -> Checkpoint:
        return self._checkpoint

    def write_checkpoint(self, commit_index: int, applied_index: int) -> None:
        """Atomically record commit and applied index, with the durable index as of now.
        Blocking (two fsyncs); may run in a worker thread."""
        assert 0 <= applied_index <= commit_index, (applied_index, commit_index)
        with self._checkpoint_lock:
            self._write_checkpoint_locked(commit_index, applied_index)

    def _write_checkpoint_locked(
        self, commit_index: int, applied_index: int, *, durable: int | None = None
    ) -> None:
        # Recovery trusts the index records up to the checkpoint's durable index, so it names
        # an entry whose record is synced too (durability.py).
        index_durable = self._durability.index_durable_index
        durable_index = index_durable if durable is None else min(durable, index_durable)
        checkpoint = Checkpoint(commit_index, applied_index, durable_index, now_ms())
        write_checkpoint_file(self.paths.checkpoint, checkpoint)
        self._checkpoint = checkpoint

    # --- retention ----------------------------------------------------------------------------

    def delete_expired(
        self,
        *,
        now: datetime,
        keep_from_index: int,
        file_reserved_hours: float,
        delete_when_hour: int | None,
        disk_max_used_ratio: float,
    ) -> list[str]:
        """Delete old whole segments, and the index files they alone needed, by RocketMQ's
        rules (dledger/log/retention.py), never one holding an index >= keep_from_index.
        Moves the log start (meta) first; returns the deleted files' names."""
        assert not self._closed
        rules = retention.RetentionRules(
            now, keep_from_index, file_reserved_hours, delete_when_hour, disk_max_used_ratio
        )
        current = self._segments.base_of(self._writer.write_position)
        candidates = [
            retention.Candidate(
                base,
                os.stat(self.paths.segment(base)).st_mtime,
                self._reader.first_index_from(
                    base + self.segment_bytes, self.first_index, self._last_index
                ),
            )
            for base in self._segments.bases
            if base < current
        ]
        if not candidates:
            return []
        usage = retention.disk_usage(self.paths.root)
        freed = [0]
        for candidate in candidates:
            freed.append(freed[-1] + os.stat(self.paths.segment(candidate.base)).st_blocks * 512)

        def disk_over(deleted: int) -> bool:
            return usage.used - freed[deleted] > disk_max_used_ratio * usage.total

        count = retention.deletable_prefix(candidates, rules, disk_over)
        return self._drop_front(candidates[count - 1]) if count else []

    def _drop_front(self, last_deleted: retention.Candidate) -> list[str]:
        new_first = last_deleted.next_first_index
        if new_first <= self._last_index:
            position = self._reader.record(new_first)[0]
        else:
            position = self._writer.write_position
        start = LogStart(EntryId(new_first - 1, self.term_at(new_first - 1)), position)
        self._meta = attrs.evolve(self._meta, start=start)
        write_meta(self.paths.meta, self._meta)  # first: a crash now leaves files to remove
        self._start = start
        deleted = [
            self._writer.delete_segment(base)
            for base in list(self._segments.bases)
            if base <= last_deleted.base
        ]
        per_file = self._index.records_per_file
        deleted += [
            self._writer.delete_index_file(first)
            for first in list(self._index.firsts)
            if first + per_file <= new_first
        ]
        return deleted


def _sync(file: Any) -> None:
    os.fdatasync(file.fd)


if TYPE_CHECKING:

    def _satisfies_raft_log(store: LogStore) -> RaftLog:
        return store  # mypy checks that LogStore implements the core's log interface
