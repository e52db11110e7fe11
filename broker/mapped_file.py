"""Fixed-size files mapped into memory, as the ConsumeQueue and IndexFile keep them.

A new file is created sparse at its full size (ftruncate): a default IndexFile is 420 MB and a
ConsumeQueue file 6 MB, and most of either is zeros for a long time. Zeros are also what both
formats read as "not written", so a sparse file and a written one of zeros mean the same.
"""

from __future__ import annotations

import mmap
import os
from pathlib import Path

from dledger.log.layout import file_name, parse_file_name

__all__ = ["create", "file_name", "list_numbered", "open_existing", "parse_file_name", "sync"]


def create(path: Path, size: int) -> mmap.mmap:
    """A new file of `size` zero bytes (sparse), mapped for writing. Replaces a leftover one."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.ftruncate(fd, size)
        return mmap.mmap(fd, size)
    finally:
        os.close(fd)  # the mapping keeps the file; no descriptor stays open per file


def open_existing(path: Path, size: int) -> mmap.mmap:
    """An existing file of exactly `size` bytes, mapped for writing; the caller checked the size."""
    fd = os.open(path, os.O_RDWR)
    try:
        return mmap.mmap(fd, size)
    finally:
        os.close(fd)


def sync(path: Path) -> None:
    """Blocking, any thread: what was written to the file through any mapping of it, on disk.

    By fdatasync on a descriptor of its own, not mmap.flush: CPython's mmap.flush holds the GIL
    through msync, so a flush in a worker thread froze the event loop for as long as the disk
    took (5-40 ms each second under load, 200 ms at worst, on every replica; docs/decisions.md).
    On Linux a shared mapping's writes are the file's page cache, which fdatasync writes back
    as msync does. A file deleted since the flush was planned has nothing left to keep."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return
    try:
        os.fdatasync(fd)
    finally:
        os.close(fd)


def list_numbered(directory: Path) -> list[int]:
    """The numbers of the 20-digit files in `directory`, ascending (other names are ignored)."""
    numbers = (parse_file_name(p.name) for p in directory.iterdir() if p.is_file())
    return sorted(n for n in numbers if n is not None)
