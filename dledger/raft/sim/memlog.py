"""The simulator's log: what the process sees (volatile) and what the disk has (durable).

A write changes the volatile copy; `fsync` makes the disk copy equal to it; a crash throws
the volatile copy away and keeps the disk one, or, as a real disk may, the disk copy plus
some prefix of the writes that were under way. Truncations are writes too: one not yet
fsynced can be undone by a crash, and the old entries come back.
"""

from __future__ import annotations

import random

from dledger.raft.entries import LOG_START_EMPTY, EntryBatch, EntryId, LogStart
from dledger.raft.events import Persist


class _Entries:
    """A log held as parallel lists after a start point."""

    def __init__(self, start: LogStart = LOG_START_EMPTY) -> None:
        self.start = start
        self.terms: list[int] = []
        self.kinds: list[int] = []
        self.payloads: list[bytes] = []

    @property
    def last_index(self) -> int:
        return self.start.prev.index + len(self.terms)

    def term_at(self, index: int) -> int:
        base = self.start.prev.index
        if index == base:
            return self.start.prev.term
        assert base < index <= self.last_index, (index, base, self.last_index)
        return self.terms[index - base - 1]

    def truncate_after(self, index: int) -> None:
        keep = index - self.start.prev.index
        assert keep >= 0, (index, self.start)
        del self.terms[keep:], self.kinds[keep:], self.payloads[keep:]

    def extend(self, batch: EntryBatch) -> None:
        assert batch.first_index == self.last_index + 1, (batch.first_index, self.last_index)
        self.terms.extend(batch.terms)
        self.kinds.extend(batch.kinds)
        self.payloads.extend(batch.payloads)

    def copy_from(self, other: _Entries, from_index: int) -> None:
        """Make entries from `from_index` on equal to `other`'s (same start)."""
        assert self.start == other.start
        keep = max(0, from_index - self.start.prev.index - 1)
        self.truncate_after(self.start.prev.index + keep)
        self.terms.extend(other.terms[keep:])
        self.kinds.extend(other.kinds[keep:])
        self.payloads.extend(other.payloads[keep:])

    def clone(self) -> _Entries:
        c = _Entries(self.start)
        c.terms, c.kinds, c.payloads = list(self.terms), list(self.kinds), list(self.payloads)
        return c


class MemLog:
    """Implements dledger.raft.storage.RaftLog over the volatile copy."""

    def __init__(self) -> None:
        self._volatile = _Entries()
        self._disk = _Entries()
        self._dirty_from = 1  # first index where the disk may differ from the volatile copy
        self.fsyncs = 0

    # RaftLog
    @property
    def start(self) -> LogStart:
        return self._volatile.start

    @property
    def last_index(self) -> int:
        return self._volatile.last_index

    def term_at(self, index: int) -> int:
        return self._volatile.term_at(index)

    def read(self, lo: int, hi: int, bytes_max: int) -> EntryBatch:
        v = self._volatile
        base = v.start.prev.index
        assert base < lo <= hi <= v.last_index, (lo, hi, base, v.last_index)
        a, b = lo - base - 1, hi - base
        if sum(map(len, v.payloads[a:b])) > bytes_max:
            total, end = 0, a
            while end < b and (end == a or total + len(v.payloads[end]) <= bytes_max):
                total += len(v.payloads[end])
                end += 1
            b = end
        return EntryBatch(lo, v.terms[a:b], v.kinds[a:b], v.payloads[a:b])

    # what the simulator does with it
    @property
    def durable_index(self) -> int:
        """The log is on disk through here (the disk copy agrees with the volatile one)."""
        return min(self._dirty_from - 1, self._volatile.last_index)

    @property
    def dirty(self) -> bool:
        """The disk differs from the volatile copy: an fsync would change something."""
        v_last = self._volatile.last_index
        return self._dirty_from <= v_last or self._disk.last_index != v_last

    def write(self, persist: Persist) -> None:
        v = self._volatile
        if persist.reset is not None:
            self._volatile = _Entries(persist.reset)
            self._disk = _Entries(persist.reset)  # a reset rewrites the store's meta durably
            self._dirty_from = persist.reset.prev.index + 1
            v = self._volatile
        if persist.truncate_after is not None:
            v.truncate_after(persist.truncate_after)
            self._dirty_from = min(self._dirty_from, persist.truncate_after + 1)
        if persist.append is not None:
            self._dirty_from = min(self._dirty_from, persist.append.first_index)
            v.extend(persist.append)

    def fsync(self) -> EntryId:
        self._disk.copy_from(self._volatile, self._dirty_from)
        self._dirty_from = self._volatile.last_index + 1
        self.fsyncs += 1
        last = self._volatile.last_index
        return EntryId(last, self._volatile.term_at(last))

    def crash(self, rng: random.Random) -> None:
        """Lose what was not fsynced; sometimes a prefix of the unsynced writes survives."""
        survivor = self._disk.clone()
        v = self._volatile
        if rng.random() < 0.3 and v.last_index >= self._dirty_from:
            # the disk got some of the writes: everything before dirty_from, then a prefix
            keep_through = rng.randint(self._dirty_from - 1, v.last_index)
            survivor.copy_from(v, self._dirty_from)
            survivor.truncate_after(keep_through)
        self._volatile = survivor
        self._disk = survivor.clone()
        self._dirty_from = survivor.last_index + 1

    def compact(self, through: int) -> None:
        """Retention: drop entries through `through` (durable and applied), on disk too."""
        assert through <= self.durable_index
        for entries in (self._volatile, self._disk):
            base = entries.start.prev.index
            if through <= base:
                continue
            start = LogStart(EntryId(through, entries.term_at(through)), 0)
            cut = through - base
            del entries.terms[:cut], entries.kinds[:cut], entries.payloads[:cut]
            entries.start = start

    def disk_has(self, entry: EntryId) -> bool:
        d = self._disk
        if entry.index <= d.start.prev.index:
            return True  # compacted: it was committed and applied here
        return entry.index <= d.last_index and d.term_at(entry.index) == entry.term

    def payload_at(self, index: int) -> bytes:
        v = self._volatile
        return v.payloads[index - v.start.prev.index - 1]

    def kind_at(self, index: int) -> int:
        v = self._volatile
        return v.kinds[index - v.start.prev.index - 1]
