"""Where a store's files live and how they are named (docs/formats.md#store-directory).

```text
<store>/dledger/
    meta  hardstate  checkpoint  abort
    data/00000000000000000000      segment files, named by the position of their first byte
    index/00000000000000000001     index files, named by the first index they can hold
```
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

import attrs

from dledger.log.errors import StoreLocked

STORE_DIR = "dledger"
DATA_DIR = "data"
INDEX_DIR = "index"
FILE_NAME_DIGITS = 20  # RocketMQ's offset2FileName: sorts by name as by number


def file_name(number: int) -> str:
    """A segment's first position or an index file's first index, as its file name."""
    assert 0 <= number < 10**FILE_NAME_DIGITS, number
    return f"{number:0{FILE_NAME_DIGITS}d}"


def parse_file_name(name: str) -> int | None:
    """The number a data or index file name stands for; None for any other name (*.tmp, ...)."""
    if len(name) != FILE_NAME_DIGITS or not name.isdigit() or not name.isascii():
        return None
    return int(name)


def list_numbered(directory: Path) -> list[int]:
    """The numbers of the data or index files in `directory`, ascending."""
    numbers = (parse_file_name(p.name) for p in directory.iterdir() if p.is_file())
    return sorted(n for n in numbers if n is not None)


@attrs.frozen
class StorePaths:
    """Every path of one replica's store, derived from the directory the operator names."""

    store_dir: Path

    @property
    def root(self) -> Path:
        return self.store_dir / STORE_DIR

    @property
    def data(self) -> Path:
        return self.root / DATA_DIR

    @property
    def index(self) -> Path:
        return self.root / INDEX_DIR

    @property
    def meta(self) -> Path:
        return self.root / "meta"

    @property
    def hardstate(self) -> Path:
        return self.root / "hardstate"

    @property
    def checkpoint(self) -> Path:
        return self.root / "checkpoint"

    @property
    def abort(self) -> Path:
        return self.root / "abort"

    def segment(self, base: int) -> Path:
        return self.data / file_name(base)

    def index_file(self, first: int) -> Path:
        return self.index / file_name(first)


def segment_label(base: int) -> str:
    """How errors and reports name a segment: relative to the store's dledger/ directory."""
    return f"{DATA_DIR}/{file_name(base)}"


def index_label(first: int) -> str:
    return f"{INDEX_DIR}/{file_name(first)}"


def lock_store(root: Path) -> int:
    """Hold an exclusive lock on the store's directory for as long as it is open: two
    processes writing one store would corrupt it. Returns the fd to close to unlock."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise StoreLocked(str(root)) from None
    return fd
