"""The flusher's fsync thread in C (dledger/log/sync_native.c): a round fdatasyncs its
descriptors, drops its page-cache runs and closes every descriptor it was given; the eventfd
turns readable when the round is done; an error is reported by errno, never raised on the
thread; one round at a time; close waits for the round in flight."""

from __future__ import annotations

import errno
import os
import select
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dledger.log import flusher as flusher_module

native = flusher_module.native
assert native is not None, (
    "dledger.log._sync_native is not built: run ./dev.sh test (pip install -e .)"
)

DONE_WITHIN_S = 10.0


@pytest.fixture
def syncer() -> Iterator[Any]:
    s = native.Syncer()
    yield s
    s.close()


def wait_collect(syncer: Any) -> int:
    readable, _, _ = select.select([syncer.fileno()], [], [], DONE_WITHIN_S)
    assert readable, "the round did not finish"
    result = syncer.collect()
    assert result is not None
    return int(result)


def is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError as err:
        assert err.errno == errno.EBADF
        return False
    return True


def test_a_round_syncs_and_closes_its_descriptors(tmp_path: Path, syncer: Any) -> None:
    fd = os.open(tmp_path / "segment", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        os.write(fd, b"x" * 20_000)
        synced, released = os.dup(fd), os.dup(fd)
        assert syncer.collect() is None and not syncer.busy
        syncer.submit([synced], [(released, 0, 8192)])
        assert syncer.busy
        assert wait_collect(syncer) == 0
        assert not syncer.busy
        assert not is_open(synced) and not is_open(released)
        assert syncer.collect() is None  # collected once
        assert os.pread(fd, 5, 0) == b"xxxxx"  # dropping clean pages loses nothing
    finally:
        os.close(fd)


def test_a_failed_sync_is_its_errno_and_still_closes_everything(
    tmp_path: Path, syncer: Any
) -> None:
    read_end, write_end = os.pipe()  # fdatasync on a pipe: EINVAL
    os.close(write_end)
    fd = os.open(tmp_path / "segment", os.O_RDWR | os.O_CREAT, 0o644)
    after, run = os.dup(fd), os.dup(fd)
    os.close(fd)
    syncer.submit([read_end, after], [(run, 0, 4096)])
    assert wait_collect(syncer) == errno.EINVAL
    assert not any(map(is_open, (read_end, after, run)))


def test_one_round_at_a_time(tmp_path: Path, syncer: Any) -> None:
    syncer.submit([], [])
    with pytest.raises(RuntimeError, match="in flight"):
        syncer.submit([], [])
    assert wait_collect(syncer) == 0
    syncer.submit([], [])  # collected: the next may go
    assert wait_collect(syncer) == 0


@pytest.mark.parametrize("bad", [[-1], ["3"], [2**40]])
def test_bad_arguments_are_refused_before_the_thread_sees_them(syncer: Any, bad: list[Any]) -> None:
    with pytest.raises((ValueError, TypeError, OverflowError)):
        syncer.submit(bad, [])
    with pytest.raises(TypeError, match="tuple"):
        syncer.submit([], [(1, 2)])
    assert not syncer.busy


def test_close_waits_for_the_round_and_is_idempotent(tmp_path: Path) -> None:
    syncer = native.Syncer()
    fd = os.open(tmp_path / "segment", os.O_RDWR | os.O_CREAT, 0o644)
    os.write(fd, b"y" * 4096)
    synced = os.dup(fd)
    os.close(fd)
    syncer.submit([synced], [])
    syncer.close()  # joins the thread: the round ran to its end
    assert not is_open(synced)
    syncer.close()
    with pytest.raises(RuntimeError, match="closed"):
        syncer.submit([], [])
    with pytest.raises(ValueError, match="closed"):
        syncer.fileno()
