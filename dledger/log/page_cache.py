"""The log's page cache: only its newest bytes stay, and reads of older ones warm them first.

After each flush the store lets go of the pages more than `cache_tail_bytes` behind its write
position (`CacheTail.releases`, run by the flush ticket once its syncs are done). On a VM whose
host takes back free memory, a page the cache has never used costs a host fault (~9 us here),
and a cache that keeps growing pays it for every page written; one that recycles its own pages
does not (docs/decisions.md, "The log keeps only its newest bytes in the page cache").

A reader of bytes that were let go of would wait for the disk wherever it touches the segment's
mapping, on the event loop. `CacheTail.cold_runs` names those bytes and `read_in` reads them in
a worker thread first (`os.preadv` releases the GIL; a fault in a mapping does not), so the
loop then finds them in the cache.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import threading
from collections.abc import Iterable, Iterator

from dledger.log.segment import Segment, SegmentFiles

# (duplicate fd, offset in the file, length): a run of one segment, for a worker thread; the
# duplicate keeps the file open whatever the loop closes meanwhile, and the taker closes it
Run = tuple[int, int, int]

READ_IN_CHUNK_BYTES = 1 << 20  # one reused buffer per thread: no fresh pages per read
_buffers = threading.local()


class CacheTail:
    """Which log bytes were let go of; owned by the store, used on the loop thread."""

    def __init__(self, segments: SegmentFiles, tail_bytes: int) -> None:
        self._segments = segments
        self.tail_bytes = tail_bytes  # 0: leave the cache to the kernel
        self.kept_from = 0  # the cache before this log position was let go of

    def releases(self, write_position: int, log_start: int) -> list[Run]:
        """The runs a flush lets go of once its syncs are done: what lies more than the tail
        behind `write_position` and was not let go of before. Every byte before the write
        position is clean once the flush ran (it syncs every file written since the last
        one); a page still dirty would only be written back, never lost: this is advice.
        Pages this process mapped by reading are unmapped first, or the kernel keeps them."""
        limit = write_position - self.tail_bytes
        start = max(self.kept_from, log_start)
        if not self.tail_bytes or limit <= start:
            return []
        self.kept_from = limit
        runs = []
        for segment, offset, length in self._pieces(start, limit, open_only=True):
            aligned = offset - offset % mmap.PAGESIZE
            segment.mm.madvise(mmap.MADV_DONTNEED, aligned, offset + length - aligned)
            runs.append((os.dup(segment.fd), offset, length))
        return runs

    def cold_runs(self, spans: Iterable[tuple[int, int]], log_start: int) -> list[Run]:
        """The parts of the byte spans [lo, hi) that were let go of, for `read_in`; empty when
        all of them are in the tail. Spans before `log_start` (deleted) are skipped."""
        runs = []
        for lo, hi in spans:
            lo, hi = max(lo, log_start), min(hi, self.kept_from)
            for segment, offset, length in self._pieces(lo, hi, open_only=False):
                runs.append((os.dup(segment.fd), offset, length))
        return runs

    def _pieces(self, lo: int, hi: int, *, open_only: bool) -> Iterator[tuple[Segment, int, int]]:
        segments = self._segments
        size = segments.segment_bytes
        while lo < hi:
            base = segments.base_of(lo)
            end = min(hi, base + size)
            segment: Segment | None = None
            if open_only:  # a closed segment is not mapped here: the kernel may keep it
                segment = segments.open_files.peek(base)
            elif base in segments:
                segment = segments.get(base)
            if segment is not None and segment.fd >= 0:
                yield segment, lo - base, end - lo
            lo = end


def let_go(runs: list[Run]) -> None:
    """Blocking: advise the kernel to drop the runs' pages, then close their descriptors."""
    try:
        for fd, offset, length in runs:
            with contextlib.suppress(OSError):  # advice: failing to take it loses nothing
                os.posix_fadvise(fd, offset, length, os.POSIX_FADV_DONTNEED)
    finally:
        close(runs)


def read_in(runs: list[Run]) -> int:
    """Blocking, for a worker thread: read the runs into the page cache (the bytes are thrown
    away), then close their descriptors. Returns the bytes read. A read error is left for
    the reader that comes after, which reports it where it belongs."""
    buffer = getattr(_buffers, "buffer", None)
    if buffer is None:
        buffer = _buffers.buffer = memoryview(bytearray(READ_IN_CHUNK_BYTES))
    done = 0
    try:
        for fd, offset, length in runs:
            end = offset + length
            while offset < end:
                try:
                    got = os.preadv(fd, [buffer[: min(READ_IN_CHUNK_BYTES, end - offset)]], offset)
                except OSError:
                    break
                if got <= 0:
                    break
                offset += got
                done += got
    finally:
        close(runs)
    return done


def close(runs: list[Run]) -> None:
    for fd, _, _ in runs:
        os.close(fd)
