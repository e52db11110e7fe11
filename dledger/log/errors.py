"""What the log store raises on purpose: operating errors, each with the fields a caller needs.

Bugs (a caller breaking the API's preconditions, an internal invariant failing) are asserts,
not these. Everything here can happen to correct code: a disk corrupts a byte, a client asks
for an index that is gone, an operator points a node at another group's store.
"""

from __future__ import annotations

import attrs


class LogError(Exception):
    """Base of every error the log store raises on purpose."""


@attrs.define
class CorruptEntry(LogError):
    """An entry (or the index record or blank record standing for it) failed a check."""

    segment: str  # file name relative to the store, e.g. "data/00000000001073741824"
    position: int  # where the bad record starts in the replicated log
    reason: str  # "header crc mismatch", "body crc mismatch", "index 7, expected 6", ...

    def __str__(self) -> str:
        return f"corrupt entry at position {self.position} in {self.segment}: {self.reason}"


@attrs.define
class EntryTooLarge(LogError):
    """A body longer than the store accepts; nothing of its batch was written."""

    size: int  # body bytes
    limit: int

    def __str__(self) -> str:
        return f"entry body of {self.size} bytes exceeds the limit of {self.limit} bytes"


@attrs.define
class IndexOutOfRange(LogError):
    """An index past the last entry (or an empty or reversed range)."""

    index: int
    first_index: int
    last_index: int

    def __str__(self) -> str:
        if self.last_index < self.first_index:
            return f"index {self.index} is not in the log: the log holds no entries"
        return (
            f"index {self.index} is not in the log: it holds indexes "
            f"{self.first_index} to {self.last_index}"
        )


@attrs.define
class Compacted(LogError):
    """An index below the first retained one: retention or a reset deleted it."""

    index: int
    first_index: int

    def __str__(self) -> str:
        return f"index {self.index} is compacted; first available index is {self.first_index}"


@attrs.define
class BelowFirstIndex(LogError):
    """truncate_after(index) with index below start.prev.index: those entries are gone already."""

    index: int
    first_index: int

    def __str__(self) -> str:
        return (
            f"cannot truncate after index {self.index}: the log starts at index "
            f"{self.first_index}, so the lowest index to truncate after is {self.first_index - 1}"
        )


@attrs.define
class StoreMismatch(LogError):
    """The store on disk was created for another group, replica or geometry."""

    field: str
    stored: object
    given: object

    def __str__(self) -> str:
        return (
            f"store was created with {self.field}={self.stored!r}, "
            f"but was opened with {self.field}={self.given!r}"
        )


@attrs.define
class CorruptStateFile(LogError):
    """A state file (meta, hardstate, checkpoint) that fails its checks."""

    path: str
    reason: str

    def __str__(self) -> str:
        return f"corrupt state file {self.path}: {self.reason}"


@attrs.define
class StoreLocked(LogError):
    """Another process (or another open LogStore in this one) holds the store."""

    path: str

    def __str__(self) -> str:
        return f"store {self.path} is open elsewhere (its lock is held)"
