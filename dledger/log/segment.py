"""Segment files: fixed-size, mmap'd, named by their first position (docs/formats.md).

Segment k holds positions [k * segment_bytes, (k+1) * segment_bytes); a file shorter than that
(created but never extended, or cut by a crash) reads as zeros past its end, so opening one
extends it to full size first. Appends are written with pwrite (`write_at`) and reads go
through the mapping (on Linux both are the file's page cache); the rare writes that zero a
range (truncation) go through the mapping. Durability comes from os.fdatasync on the file
descriptor, which releases the GIL (mmap.flush does not) and covers both kinds of writes.
"""

from __future__ import annotations

import bisect
import contextlib
import errno
import mmap
import os
from collections.abc import Sequence
from pathlib import Path

from dledger import limits
from dledger.log.entry import BLANK_BYTES_MIN
from dledger.log.errors import CorruptEntry, StoreMismatch
from dledger.log.layout import list_numbered, segment_label
from dledger.log.open_files import OpenFiles

ZERO_CHUNK_BYTES = 1 << 20  # zeroing and zero-scanning work in chunks of this size
ZERO_PIECE_BYTES = 64 << 10  # a zero scan compares pieces of this size with zeros
_ZERO_BYTES = bytes(ZERO_CHUNK_BYTES)
_ZEROS = memoryview(_ZERO_BYTES)


def entry_position(write_position: int, entry_bytes: int, segment_bytes: int) -> int:
    """Where an entry of `entry_bytes` starts when the log's write position is `write_position`.

    It starts there unless it would run past the segment end or leave 1 to 7 bytes before it;
    then the segment's tail becomes a blank record and the entry starts the next segment. Every
    replica with the same segment_bytes computes the same positions (the broker's msgIds).
    """
    offset = write_position % segment_bytes
    end = offset + entry_bytes
    if end > segment_bytes - BLANK_BYTES_MIN and end != segment_bytes:
        return write_position - offset + segment_bytes
    return write_position


def fits(end_offset: int, segment_bytes: int) -> bool:
    """Whether an entry ending at `end_offset` of its segment obeys the blank-record rule."""
    return end_offset <= segment_bytes - BLANK_BYTES_MIN or end_offset == segment_bytes


def zero(mm: mmap.mmap, start: int, end: int) -> None:
    """Write zeros over [start, end) of a mapping, a chunk at a time (no big allocation)."""
    while start < end:
        count = min(end - start, ZERO_CHUNK_BYTES)
        mm[start : start + count] = _ZEROS[:count]
        start += count


def nonzero_end(fd: int, start: int, end: int) -> int:
    """The offset just past the last non-zero byte in [start, end) of a file, or `start` when
    all of it is zero. Holes (SEEK_HOLE) are skipped without reading them."""
    last = start
    position = start
    while position < end:
        try:
            data = os.lseek(fd, position, os.SEEK_DATA)
        except OSError as err:
            if err.errno == errno.ENXIO:  # no data after `position`
                break
            raise
        if data >= end:
            break
        hole = min(os.lseek(fd, data, os.SEEK_HOLE), end)
        while data < hole:
            count = min(hole - data, ZERO_CHUNK_BYTES)
            written = _written_length(os.pread(fd, count, data))
            if written:
                last = data + written
            data += count
        position = hole
    return last


def write_at(fd: int, pieces: Sequence[bytes], offset: int) -> None:
    """Write `pieces` back to back at `offset` of file `fd`, every byte: a short write (a disk
    filling up) is followed by another, which raises the kernel's error (ENOSPC). A write that
    takes nothing without an error raises ENOSPC itself rather than trying forever."""
    written = os.pwritev(fd, pieces, offset)
    total = sum(map(len, pieces))
    if written < total:
        rest = memoryview(b"".join(pieces))[written:]
        while rest:
            done = os.pwrite(fd, rest, offset + written)
            if done <= 0:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            written += done
            rest = rest[done:]


def _written_length(chunk: bytes) -> int:
    """Length of `chunk` up to its last non-zero byte. Comparing with zeros is a memcmp;
    bytes.rstrip walks byte by byte, so it only runs on the last non-zero piece."""
    zeros = _ZERO_BYTES
    end = len(chunk)
    while end:
        piece = min(end, ZERO_PIECE_BYTES)
        if chunk[end - piece : end] != zeros[:piece]:
            return end - piece + len(chunk[end - piece : end].rstrip(b"\0"))
        end -= piece
    return 0


class Segment:
    """One mapped segment file: `mm` covers the whole segment, `fd` stays open for fdatasync."""

    __slots__ = ("base", "fd", "label", "mm", "path", "size")

    def __init__(self, base: int, path: Path, fd: int, mm: mmap.mmap, size: int) -> None:
        self.base = base
        self.path = path
        self.fd = fd
        self.mm = mm
        self.size = size
        self.label = segment_label(base)

    @classmethod
    def create(cls, path: Path, base: int, size: int, *, preallocate: bool) -> Segment:
        """A new, all-zero segment (an old file of that name is emptied first).

        Preallocation reserves the blocks now (ENOSPC shows up here, not mid-append, and
        appends do not allocate); without it the file is sparse.
        """
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            allocate(fd, size, preallocate=preallocate)
            mm = mmap.mmap(fd, size)
        except BaseException:
            os.close(fd)
            raise
        return cls(base, path, fd, mm, size)

    @classmethod
    def open(cls, path: Path, base: int, size: int) -> Segment:
        fd = os.open(path, os.O_RDWR)
        try:
            length = os.fstat(fd).st_size
            if length > size:
                raise StoreMismatch(f"size of {segment_label(base)}", length, size)
            if length < size:
                os.ftruncate(fd, size)  # what was never written reads as zeros
            mm = mmap.mmap(fd, size)
        except BaseException:
            os.close(fd)
            raise
        return cls(base, path, fd, mm, size)

    def close(self) -> None:
        self.mm.close()
        os.close(self.fd)
        self.fd = -1  # a flush ticket that captured this file keeps its own duplicate

    def __repr__(self) -> str:
        return f"Segment({self.label})"


def allocate(fd: int, size: int, *, preallocate: bool) -> None:
    if preallocate:
        try:
            os.posix_fallocate(fd, 0, size)
            return
        except OSError as err:
            if err.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                raise  # ENOSPC and friends are the operator's to see
    os.ftruncate(fd, size)


class SegmentFiles:
    """The segment files of a store, opened (mapped) lazily, found by arithmetic."""

    def __init__(self, directory: Path, segment_bytes: int, *, preallocate: bool) -> None:
        self.directory = directory
        self.segment_bytes = segment_bytes
        self.preallocate = preallocate
        self.bases: list[int] = list_numbered(directory)
        for base in self.bases:
            if base % segment_bytes:
                raise CorruptEntry(
                    segment_label(base), base, f"name is not a multiple of {segment_bytes}"
                )
        self.open_files: OpenFiles[Segment] = OpenFiles(limits.SEGMENTS_OPEN_MAX)

    def base_of(self, position: int) -> int:
        return position - position % self.segment_bytes

    def __contains__(self, base: int) -> bool:
        i = bisect.bisect_left(self.bases, base)
        return i < len(self.bases) and self.bases[i] == base

    def get(self, base: int) -> Segment:
        """The segment starting at `base`, which must exist."""
        segment = self.open_files.get(base)
        if segment is None:
            assert base in self, base
            segment = Segment.open(self.directory / _name(base), base, self.segment_bytes)
            self.open_files.add(base, segment)
        return segment

    def create(self, base: int) -> Segment:
        assert base % self.segment_bytes == 0, base
        assert base not in self, base
        path = self.directory / _name(base)
        segment = Segment.create(path, base, self.segment_bytes, preallocate=self.preallocate)
        self.adopt(segment)
        return segment

    def adopt(self, segment: Segment) -> None:
        """Take in a segment created elsewhere (prepared ahead, off the event loop)."""
        assert segment.base not in self, segment
        bisect.insort(self.bases, segment.base)
        self.open_files.add(segment.base, segment)

    def delete(self, base: int) -> None:
        self.open_files.discard(base)
        self.bases.remove(base)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.directory / _name(base))

    def close(self) -> None:
        self.open_files.close_all()

    def opened(self) -> list[Segment]:
        return list(self.open_files)


def _name(base: int) -> str:
    return segment_label(base).rsplit("/", 1)[1]
