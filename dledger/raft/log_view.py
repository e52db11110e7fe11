"""The log as one step of the core sees it: the stored log plus the step's pending changes.

The core reads the log through `RaftLog` and changes it only through a `Persist` effect,
which the caller performs before the next event. Within one step the core may both change
the log and read it back (a new leader appends its no-op and sends it; a follower truncates
a conflicting suffix and appends the leader's entries), so every read goes through this view,
which layers the step's pending reset, truncation and append over the store. This is what
etcd-io/raft's `log_unstable.go` does for its `raftLog`; here the overlay lives for one step
only, since the caller performs every `Persist` before the next event.

At most one of each change is pending, in the order a `Persist` performs them: a reset, or a
truncation, then appends (consecutive appends merge into one batch). `clear` starts the
next step. The view knows nothing of commit, durability or configurations: the core keeps
those rules next to the calls that change the log.
"""

from __future__ import annotations

from dledger.raft.entries import EntryBatch, EntryId, LogStart
from dledger.raft.storage import RaftLog


class LogView:
    def __init__(self, log: RaftLog) -> None:
        self.log = log
        self.pending_reset: LogStart | None = None  # the log restarts empty after reset.prev
        self.pending_truncate: int | None = None  # entries after this index are dropped
        self.pending_append: EntryBatch | None = None  # then these are appended

    def clear(self) -> None:
        """Forget the pending changes: the caller has performed them (a new step begins)."""
        self.pending_reset = None
        self.pending_truncate = None
        self.pending_append = None

    def has_changes(self) -> bool:
        return (
            self.pending_reset is not None
            or self.pending_truncate is not None
            or self.pending_append is not None
        )

    # --- reading ----------------------------------------------------------------------------

    def start(self) -> LogStart:
        return self.pending_reset or self.log.start

    def last_index(self) -> int:
        if self.pending_append is not None:
            return self.pending_append.last_index
        if self.pending_truncate is not None:
            return self.pending_truncate
        if self.pending_reset is not None:
            return self.pending_reset.prev.index
        return self.log.last_index

    def term_at(self, index: int) -> int:
        """Term of the entry at `index`, for start().prev.index <= index <= last_index()."""
        pending = self.pending_append
        if pending is not None and index >= pending.first_index:
            return pending.term_at(index)
        if self.pending_reset is not None:
            assert index == self.pending_reset.prev.index, index
            return self.pending_reset.prev.term
        if self.pending_truncate is not None:
            assert index <= self.pending_truncate, (index, self.pending_truncate)
        return self.log.term_at(index)

    def last_id(self) -> EntryId:
        last = self.last_index()
        return EntryId(last, self.term_at(last))

    def read(self, lo: int, hi: int, *, entries_max: int, bytes_max: int) -> EntryBatch:
        """Entries lo..hi, at most `entries_max` of them; from the store, at least the entry at
        `lo` and no more once `bytes_max` of payload is reached. A read never spans the store
        and the pending append: it stops where the pending entries begin."""
        hi = min(hi, lo + entries_max - 1)
        pending = self.pending_append
        if pending is not None and lo >= pending.first_index:
            return pending.slice(lo, hi)
        stored_hi = min(hi, self.log.last_index if pending is None else pending.first_index - 1)
        return self.log.read(lo, stored_hi, bytes_max)

    def first_index_of_term(self, term: int, hi: int) -> int:
        """First index in (log start, hi] whose term is `term` (terms never decrease)."""
        lo = self.start().prev.index + 1
        while lo < hi:
            mid = (lo + hi) // 2
            if self.term_at(mid) < term:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def last_index_with_term_at_most(self, term: int, hi: int) -> int:
        """Largest index in [log start, hi] whose term is <= term (binary search)."""
        lo = self.start().prev.index
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.term_at(mid) <= term:
                lo = mid
            else:
                hi = mid - 1
        return lo

    # --- changing ---------------------------------------------------------------------------

    def append(self, batch: EntryBatch) -> None:
        """Append right after the last entry (merging with an append already pending)."""
        assert batch.first_index == self.last_index() + 1, (batch.first_index, self.last_index())
        p = self.pending_append
        if p is None:
            self.pending_append = batch
        else:
            self.pending_append = EntryBatch(
                p.first_index,
                [*p.terms, *batch.terms],
                [*p.kinds, *batch.kinds],
                [*p.payloads, *batch.payloads],
            )

    def truncate_after(self, index: int) -> None:
        """Drop entries after `index`: once per step, before anything is appended."""
        assert self.pending_append is None and self.pending_reset is None
        self.pending_truncate = index

    def reset(self, start: LogStart) -> None:
        """Drop the whole log; it restarts empty after start.prev. Once per step, first."""
        assert self.pending_append is None and self.pending_truncate is None
        self.pending_reset = start
