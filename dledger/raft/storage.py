"""The log as the core reads it: a small interface both the simulator's in-memory log and
the disk log (dledger/log/store.py) implement.

The core only reads through this interface. Writes are effects (`Persist`) that the caller
performs before it feeds the core its next event, so at the start of every step the log
holds exactly what the core has asked for, durable or not; durability is reported back
separately with `Persisted(through=index)`.
"""

from __future__ import annotations

from typing import Protocol

from dledger.raft.entries import EntryBatch, LogStart


class RaftLog(Protocol):
    @property
    def start(self) -> LogStart:
        """Where the retained log begins; `start.prev.index + 1` is the first retained index."""
        ...

    @property
    def last_index(self) -> int:
        """Index of the last entry, or `start.prev.index` when no entry is retained."""
        ...

    def term_at(self, index: int) -> int:
        """Term of the entry at `index`, for start.prev.index <= index <= last_index.

        At `start.prev.index` it answers start.prev.term (0 for an empty log at index 0).
        Outside that range it is a bug in the caller: implementations assert.
        """
        ...

    def read(self, lo: int, hi: int, bytes_max: int) -> EntryBatch:
        """Entries lo..hi inclusive, stopping early once `bytes_max` of payload is reached but
        always returning at least the entry at `lo`. Requires first index <= lo <= hi <= last."""
        ...
