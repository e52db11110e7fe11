"""Fixtures shared by the broker's tests."""

from __future__ import annotations

import os

import pytest

from broker import mapped_file


@pytest.fixture
def synced_inodes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The inode of every file mapped_file.sync fdatasyncs from now on (it still syncs)."""
    synced: list[int] = []
    real = os.fdatasync

    def fdatasync(fd: int) -> None:
        synced.append(os.fstat(fd).st_ino)
        real(fd)

    monkeypatch.setattr(mapped_file.os, "fdatasync", fdatasync)
    return synced
