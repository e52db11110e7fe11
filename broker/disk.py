"""Is the store's disk too full to take more messages? RocketMQ's disk-full flag.

A 4.9 broker marks its store unwritable once the commit log's partition is more than
diskSpaceWarningLevelRatio (90 %) used, and refuses every put with SERVICE_NOT_AVAILABLE (the
remark names the full disk) until it falls below again; pulls and queries go on. Below that,
diskMaxUsedSpaceRatio (75 % by default) only makes retention delete old segments sooner
(dledger/log/store.py). The check here is the same: the threshold is the larger of the two, so
a configured diskMaxUsedSpaceRatio above 90 % raises it, and retention always gets the chance to
free space before writes stop.

`statvfs` costs a system call, so the answer is kept for DISK_CHECK_INTERVAL_S; a send reads
the cached answer.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import trio

log = logging.getLogger("broker.disk")

DISK_FULL_RATIO = 0.90  # RocketMQ's diskSpaceWarningLevelRatio default
DISK_CHECK_INTERVAL_S = 1.0  # a filling disk is noticed within this; sends never statvfs


class Usage(NamedTuple):
    total: int
    used: int
    free: int


def _disk_usage(path: Path) -> Usage:
    total, used, free = shutil.disk_usage(path)
    return Usage(total, used, free)


class DiskGuard:
    def __init__(
        self,
        path: Path,
        max_used_ratio: float,
        usage: Callable[[Path], Usage] = _disk_usage,
        clock: Callable[[], float] = trio.current_time,
    ) -> None:
        self.path = path
        self.full_ratio = max(DISK_FULL_RATIO, max_used_ratio)
        self.usage = usage  # tests put a fake here
        self._clock = clock
        self._checked_at: float | None = None
        self._used_ratio = 0.0

    def used_ratio(self) -> float:
        """The share of the disk in use, as of at most DISK_CHECK_INTERVAL_S ago."""
        now = self._clock()
        if self._checked_at is None or now - self._checked_at >= DISK_CHECK_INTERVAL_S:
            self._checked_at = now
            try:
                usage = self.usage(self.path)
            except OSError as err:
                log.warning("disk usage of %s unknown: %s", self.path, err)
                return self._used_ratio
            ratio = usage.used / usage.total if usage.total > 0 else 0.0
            if (ratio > self.full_ratio) != (self._used_ratio > self.full_ratio):
                state = "full: writes refused" if ratio > self.full_ratio else "writable again"
                log.warning("disk of %s %.1f%% used: %s", self.path, ratio * 100, state)
            self._used_ratio = ratio
        return self._used_ratio

    def full(self) -> str | None:
        """Why writes are refused now (the disk is past the ratio), or None."""
        ratio = self.used_ratio()
        if ratio > self.full_ratio:
            return (
                f"the broker's disk is full [{ratio * 100:.1f}% used, writes stop above "
                f"{self.full_ratio * 100:.0f}%]"
            )
        return None

    def forget(self) -> None:
        """Check again at the next call (tests, and after retention freed space)."""
        self._checked_at = None
