"""What is on disk: dirty files, flush tickets in flight, and the durable index they earn.

A flush is split in three so the fsync runs off the event loop while appends go on:
`begin` (loop thread) captures what is dirty and the last index written; `FlushTicket.run`
(any thread) fdatasyncs duplicates of the captured descriptors, releasing the GIL; `complete`
(loop thread) raises the durable index to what the ticket covered, capped by every truncation
made since it began, because a truncated entry is not made durable by syncing its successor.
A ticket also re-syncs the files of tickets still in flight, so finishing first never lets it
claim bytes another thread is still writing back.

Index records written by appends are synced less often than the data: a ticket takes the
dirty index files along only once INDEX_SYNC_INTERVAL_MS passed since the last ticket that did
(or when nothing else is dirty, or when asked to: `flush`, close). They are derived data:
recovery walks the segments from the checkpoint's durable entry and rewrites every index record
after it, so an entry whose data is fsynced survives a power loss without its record. What the
records are needed for is the checkpoint's own claim (recovery trusts the records up to it), so
a checkpoint vouches only for `index_durable_index`: entries whose data and records are both
synced. Each index fdatasync is a journal commit of its own (extents written for the first
time), about as dear as the data's: under SYNC_FLUSH, one per append round on every replica
(docs/decisions.md, "Index records are synced with the checkpoint's needs, not every round").
"""

from __future__ import annotations

import mmap
import os
import time
from pathlib import Path
from typing import Protocol

import attrs

from dledger import limits
from dledger.log.page_cache import Run, close, let_go
from dledger.log.state_file import fsync_dir


class SyncedFile(Protocol):
    """A segment or an index file: an open descriptor, -1 once closed."""

    fd: int


@attrs.define(eq=False)
class FlushTicket:
    """One flush: what `begin` captured. Call run() exactly once, then complete()."""

    sequence: int
    last_index: int  # everything through here was written when the ticket began
    fds: list[int]  # duplicates, closed by run(), so closing a file meanwhile is harmless
    directories: list[Path]  # directories whose entries changed (files created or removed)
    releases: list[Run] = attrs.Factory(list)  # page cache to let go of after the syncs
    covers_index: bool = True  # the index records through last_index are synced too
    ran: bool = False
    fsyncs: int = 0

    def run(self) -> None:
        """Blocking: fdatasync the captured files, fsync the directories, then advise the
        kernel to drop the `releases` (clean by then) from the page cache.

        Safe in a worker thread. An error (EIO) propagates: after a failed fsync the kernel
        may have dropped the dirty pages, so the only safe answer is to stop the process.
        """
        assert not self.ran, "a ticket runs once"
        try:
            for fd in self.fds:
                os.fdatasync(fd)
                self.fsyncs += 1
            for directory in self.directories:
                fsync_dir(directory)
                self.fsyncs += 1
            releases, self.releases = self.releases, []
            let_go(releases)
        finally:
            for fd in self.fds:
                os.close(fd)
            close(self.releases)  # not let go of: a sync failed
            self.ran = True


class Durability:
    """Dirty-state bookkeeping for one store; every method runs on the store owner's thread."""

    def __init__(self, durable_index: int) -> None:
        self.durable_index = durable_index  # data fsynced through here
        self.index_durable_index = durable_index  # data and index records fsynced through here
        self.dirty: set[SyncedFile] = set()  # written since the last begin: every ticket syncs
        self.dirty_index: set[SyncedFile] = set()  # index files appends wrote: synced when due
        self.dirty_directories: set[Path] = set()
        self.dirty_bytes = 0
        self.flushes = 0  # tickets completed
        self.fsyncs = 0  # fdatasync/fsync calls made by them
        self._inflight: dict[int, set[SyncedFile]] = {}
        self._truncations: list[tuple[int, int]] = []  # (next sequence then, index)
        self._next_sequence = 0
        self._index_synced_at = -float("inf")  # time.monotonic() of the last index-syncing begin

    @property
    def dirty_pages(self) -> int:
        return self.dirty_bytes // mmap.PAGESIZE

    def has_data_dirty(self) -> bool:
        """Entries (or file creations and removals) written and not yet captured: what every
        ticket syncs."""
        return bool(self.dirty or self.dirty_directories)

    def has_dirty(self) -> bool:
        return self.has_data_dirty() or bool(self.dirty_index)

    def begin(self, last_index: int, *, everything: bool = False) -> FlushTicket | None:
        """Capture what is dirty for a ticket; None when nothing is. The dirty index files go
        along when `everything`, when nothing else is dirty, or once INDEX_SYNC_INTERVAL_MS
        passed since they last did."""
        if not self.has_dirty():
            return None
        now = time.monotonic()
        with_index = (
            everything
            or not self.has_data_dirty()
            or now - self._index_synced_at >= limits.INDEX_SYNC_INTERVAL_MS / 1000
        )
        files = set(self.dirty)
        if with_index:
            files |= self.dirty_index
            self.dirty_index.clear()
            self._index_synced_at = now
        for inflight in self._inflight.values():
            files |= inflight
        open_files = [f for f in files if f.fd >= 0]
        ticket = FlushTicket(
            sequence=self._next_sequence,
            last_index=last_index,
            fds=[os.dup(f.fd) for f in open_files],
            directories=sorted(self.dirty_directories),
            covers_index=with_index,
        )
        self._inflight[ticket.sequence] = set(open_files)
        self._next_sequence += 1
        self.dirty.clear()
        self.dirty_directories.clear()
        self.dirty_bytes = 0
        return ticket

    def complete(self, ticket: FlushTicket) -> int:
        assert ticket.ran, "complete a ticket after it ran"
        del self._inflight[ticket.sequence]
        covered = ticket.last_index
        for marker, index in self._truncations:
            if ticket.sequence < marker:  # the truncation happened after this ticket began
                covered = min(covered, index)
        self.durable_index = max(self.durable_index, covered)
        if ticket.covers_index:
            self.index_durable_index = max(self.index_durable_index, covered)
        if self._inflight:
            oldest = min(self._inflight)
            self._truncations = [(m, i) for m, i in self._truncations if m > oldest]
        else:
            self._truncations.clear()
        self.flushes += 1
        self.fsyncs += ticket.fsyncs
        return self.durable_index

    def truncated(self, index: int) -> None:
        """Entries after `index` are gone: nothing after it is durable, now or by a ticket
        that began before this call."""
        self.durable_index = min(self.durable_index, index)
        self.index_durable_index = min(self.index_durable_index, index)
        if self._inflight:
            self._truncations.append((self._next_sequence, index))

    def reset(self, index: int) -> None:
        """The log restarts empty after `index` (its meta is already durable)."""
        self.truncated(index)
        self.durable_index = self.index_durable_index = index

    def sync_if_dirty(self, file: SyncedFile) -> None:
        """A file about to be closed to make room: sync it now if a ticket would have."""
        if file in self.dirty or file in self.dirty_index:
            os.fdatasync(file.fd)
            self.dirty.discard(file)
            self.dirty_index.discard(file)

    def forget(self, file: SyncedFile) -> None:
        """A file closed for good (deleted): nothing in it needs syncing any more."""
        self.dirty.discard(file)
        self.dirty_index.discard(file)
