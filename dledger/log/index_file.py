"""Index files: one fixed-size record per entry, so that finding an entry by index, and its
term, is arithmetic plus one unpack (docs/formats.md#index-file).

The index is derived data: recovery rewrites records that disagree with the entries they point
at, and rebuilds a missing file from the segments.
"""

from __future__ import annotations

import bisect
import contextlib
import mmap
import os
import struct
from pathlib import Path

from dledger import limits
from dledger.log.errors import StoreMismatch
from dledger.log.layout import file_name, index_label, list_numbered
from dledger.log.open_files import OpenFiles
from dledger.log.segment import allocate, zero

# Index record. Big-endian. Spec: docs/formats.md#index-file; change both or neither.
#  off len field     meaning
#    0   8 position  where the entry starts in the data segments
#    8   8 index     the entry's index (a check: must equal the slot's index)
#   16   8 term      the entry's term
#   24   4 size      header + body (>= 44); 0 means "not written"
#   28   2 kind      as in the entry header
#   30   2 reserved  0
RECORD = struct.Struct(">qqqIHH")
assert RECORD.size == limits.INDEX_RECORD_BYTES == 32
EMPTY_RECORD = bytes(RECORD.size)


def index_file_first(index: int, records_per_file: int) -> int:
    """The name (first index) of the index file that holds `index`."""
    assert index >= 1, index
    return ((index - 1) // records_per_file) * records_per_file + 1


class IndexFile:
    """One mapped index file holding records for indexes first .. first + records - 1."""

    __slots__ = ("fd", "first", "label", "mm", "path", "records")

    def __init__(self, first: int, path: Path, fd: int, mm: mmap.mmap, records: int) -> None:
        self.first = first
        self.path = path
        self.fd = fd
        self.mm = mm
        self.records = records
        self.label = index_label(first)

    @classmethod
    def create(cls, path: Path, first: int, records: int, *, preallocate: bool) -> IndexFile:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            allocate(fd, records * RECORD.size, preallocate=preallocate)
            mm = mmap.mmap(fd, records * RECORD.size)
        except BaseException:
            os.close(fd)
            raise
        return cls(first, path, fd, mm, records)

    @classmethod
    def open(cls, path: Path, first: int, records: int) -> IndexFile:
        size = records * RECORD.size
        fd = os.open(path, os.O_RDWR)
        try:
            length = os.fstat(fd).st_size
            if length > size:
                raise StoreMismatch(f"size of {index_label(first)}", length, size)
            if length < size:
                os.ftruncate(fd, size)
            mm = mmap.mmap(fd, size)
        except BaseException:
            os.close(fd)
            raise
        return cls(first, path, fd, mm, records)

    @property
    def last(self) -> int:
        """The last index this file can hold."""
        return self.first + self.records - 1

    def offset(self, index: int) -> int:
        assert self.first <= index <= self.last, (index, self.first)
        return (index - self.first) * RECORD.size

    def record(self, index: int) -> tuple[int, int, int, int, int, int]:
        """(position, index, term, size, kind, reserved) of the slot for `index`."""
        return RECORD.unpack_from(self.mm, self.offset(index))

    def clear(self, from_index: int, through_index: int) -> None:
        """Zero the slots from_index..through_index (clamped to this file)."""
        lo = max(from_index, self.first)
        hi = min(through_index, self.last)
        if lo <= hi:
            zero(self.mm, self.offset(lo), self.offset(hi) + RECORD.size)

    def close(self) -> None:
        self.mm.close()
        os.close(self.fd)
        self.fd = -1  # a flush ticket that captured this file keeps its own duplicate

    def __repr__(self) -> str:
        return f"IndexFile({self.label})"


class IndexFiles:
    """The index files of a store, opened lazily, found by arithmetic."""

    def __init__(self, directory: Path, records_per_file: int, *, preallocate: bool) -> None:
        self.directory = directory
        self.records_per_file = records_per_file
        self.preallocate = preallocate
        self.firsts: list[int] = [
            first
            for first in list_numbered(directory)
            if first >= 1 and (first - 1) % records_per_file == 0  # others are not ours: ignored
        ]
        self.open_files: OpenFiles[IndexFile] = OpenFiles(limits.INDEX_FILES_OPEN_MAX)

    def __contains__(self, first: int) -> bool:
        i = bisect.bisect_left(self.firsts, first)
        return i < len(self.firsts) and self.firsts[i] == first

    def first_of(self, index: int) -> int:
        return index_file_first(index, self.records_per_file)

    def find(self, index: int) -> IndexFile | None:
        """The file holding the slot for `index`, or None when it does not exist."""
        first = self.first_of(index)
        file = self.open_files.get(first)
        if file is None:
            if first not in self:
                return None
            path = self.directory / file_name(first)
            file = IndexFile.open(path, first, self.records_per_file)
            self.open_files.add(first, file)
        return file

    def get_or_create(self, index: int) -> tuple[IndexFile, bool]:
        """The file holding the slot for `index`, created if missing; (file, created)."""
        file = self.find(index)
        if file is not None:
            return file, False
        first = self.first_of(index)
        path = self.directory / file_name(first)
        file = IndexFile.create(path, first, self.records_per_file, preallocate=self.preallocate)
        bisect.insort(self.firsts, first)
        self.open_files.add(first, file)
        return file, True

    def record(self, index: int) -> tuple[int, int, int, int, int, int] | None:
        file = self.find(index)
        return None if file is None else file.record(index)

    def delete(self, first: int) -> None:
        self.open_files.discard(first)
        self.firsts.remove(first)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.directory / file_name(first))

    def close(self) -> None:
        self.open_files.close_all()

    def opened(self) -> list[IndexFile]:
        return list(self.open_files)
