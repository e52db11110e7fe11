"""A bounded set of open (mapped) files, least recently used closed first.

A store may hold thousands of segment and index files; keeping all of them mapped would run
out of file descriptors. Closing a file that holds unsynced writes would let a flush ticket
skip it, so the owner's `before_close` hook syncs such a file first.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Generic, Protocol, TypeVar


class Closable(Protocol):
    fd: int

    def close(self) -> None: ...


F = TypeVar("F", bound=Closable)


class OpenFiles(Generic[F]):
    def __init__(self, open_max: int) -> None:
        assert open_max >= 2, open_max  # the file being written and one being read
        self.open_max = open_max
        self.before_close: Callable[[F], None] | None = None
        self.pinned: F | None = None  # never closed to make room (the one being written)
        self._files: OrderedDict[int, F] = OrderedDict()

    def get(self, key: int) -> F | None:
        file = self._files.get(key)
        if file is not None:
            self._files.move_to_end(key)
        return file

    def peek(self, key: int) -> F | None:
        """The open file, without counting this as a use."""
        return self._files.get(key)

    def add(self, key: int, file: F) -> None:
        assert key not in self._files, key
        while len(self._files) >= self.open_max:
            victim = next(k for k, f in self._files.items() if f is not self.pinned)
            self.close(victim)
        self._files[key] = file

    def close(self, key: int) -> None:
        file = self._files.pop(key, None)
        if file is not None:
            if self.before_close is not None:
                self.before_close(file)
            file.close()

    def discard(self, key: int) -> None:
        """Close without the hook: the file is being deleted, its writes do not matter."""
        file = self._files.pop(key, None)
        if file is not None:
            file.close()

    def close_all(self) -> None:
        for key in list(self._files):
            self.close(key)

    def __iter__(self) -> Iterator[F]:
        return iter(list(self._files.values()))
