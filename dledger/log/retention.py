"""Which old segments retention may delete (RocketMQ's fileReservedTime, deleteWhen and
diskMaxUsedSpaceRatio), decided apart from the deleting so the rules read on one screen.

A segment goes when it is older than the reserved time and it is the delete hour, or at once
while the disk is fuller than the ratio allows; never the segment being written, never one
holding an index the caller still needs, and only from the front, so the log stays
contiguous.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Sequence
from datetime import datetime
from pathlib import Path

import attrs

SECONDS_PER_HOUR = 3600


@attrs.frozen
class Candidate:
    """A segment that could go: its first position, modification time, and the first index
    the log would keep if it and every segment before it were deleted."""

    base: int
    mtime_s: float
    next_first_index: int


@attrs.frozen
class RetentionRules:
    now: datetime
    keep_from_index: int  # the caller still needs this index and everything after it
    file_reserved_hours: float
    delete_when_hour: int | None  # None: any hour
    disk_max_used_ratio: float

    def __attrs_post_init__(self) -> None:
        assert self.file_reserved_hours >= 0, self.file_reserved_hours
        assert self.delete_when_hour is None or 0 <= self.delete_when_hour < 24
        assert 0 < self.disk_max_used_ratio <= 1, self.disk_max_used_ratio


def disk_usage(path: Path) -> shutil._ntuple_diskusage:
    """Total and used bytes of the filesystem holding `path` (a seam for tests)."""
    return shutil.disk_usage(path)


def deletable_prefix(
    candidates: Sequence[Candidate],
    rules: RetentionRules,
    disk_over: Callable[[int], bool],
) -> int:
    """How many of `candidates` (oldest first, the segment being written excluded) to delete.

    `disk_over(k)` tells whether the disk would still be fuller than the ratio after deleting
    the first k candidates; it is asked only while the answer matters.
    """
    on_the_hour = rules.delete_when_hour is None or rules.now.hour == rules.delete_when_hour
    now_s = rules.now.timestamp()
    count = 0
    for candidate in candidates:
        if candidate.next_first_index > rules.keep_from_index:
            break  # it holds an index the caller still needs
        expired = now_s - candidate.mtime_s >= rules.file_reserved_hours * SECONDS_PER_HOUR
        if not ((expired and on_the_hour) or disk_over(count)):
            break
        count += 1
    return count
