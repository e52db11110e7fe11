"""How a store is configured: geometry, flush policy, recovery options (docs/log-store.md)."""

from __future__ import annotations

import enum
from typing import Any

import attrs

from dledger import limits


class FlushPolicy(enum.Enum):
    """RocketMQ's flushDiskType."""

    SYNC_FLUSH = "SYNC_FLUSH"  # an entry counts as durable only after an fsync covering it
    ASYNC_FLUSH = "ASYNC_FLUSH"  # fsync in the background: every flush_interval_ms or least pages


def _at_least(minimum: int) -> Any:
    def validate(instance: object, attribute: attrs.Attribute[int], value: int) -> None:
        if value < minimum:
            raise ValueError(f"{attribute.name} must be at least {minimum}, got {value}")

    return validate


@attrs.frozen
class StoreConfig:
    segment_bytes: int = attrs.field(
        default=limits.SEGMENT_BYTES_DEFAULT, validator=_at_least(limits.SEGMENT_BYTES_MIN)
    )
    index_records_per_file: int = attrs.field(
        default=limits.INDEX_RECORDS_PER_FILE_DEFAULT, validator=_at_least(1)
    )
    flush: FlushPolicy = FlushPolicy.SYNC_FLUSH
    flush_interval_ms: int = attrs.field(
        default=limits.FLUSH_INTERVAL_MS_DEFAULT, validator=_at_least(1)
    )
    flush_least_pages: int = attrs.field(
        default=limits.FLUSH_LEAST_PAGES_DEFAULT, validator=_at_least(0)
    )
    # ASYNC_FLUSH, RocketMQ's flushCommitLogTimed: flush at most once per flush_interval_ms,
    # and then only once flush_least_pages are dirty (or after the thorough interval)
    flush_timed: bool = False
    # keep this much of the log behind the write position in the page cache; release the
    # rest after each flush (0: leave it to the kernel)
    cache_tail_bytes: int = attrs.field(
        default=limits.CACHE_TAIL_BYTES_DEFAULT, validator=_at_least(0)
    )
    preallocate: bool = True  # reserve a segment's blocks when it is created
    repair: bool = False  # at open, cut at a corrupt entry even when valid entries follow it
