"""Group commit with trio: concurrent appenders share fsyncs; ASYNC_FLUSH flushes on its
interval or once enough is dirty; durable-index callbacks arrive in order. Every test runs
twice: rounds on the C fsync thread (dledger/log/sync_native.c) and on trio's worker threads."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import attrs
import pytest
import trio
import trio.testing

from dledger.log import flusher as flusher_module
from dledger.log.durability import FlushTicket
from dledger.log.flusher import Flusher
from dledger.log.store import LogStore
from tests.log.helpers import ASYNC_SMALL, SMALL, append_one, batch_of, open_store

APPENDERS = 64
APPENDS_EACH = 16


@pytest.fixture(autouse=True, params=["native", "threads"])
def fsync_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Which thread runs the rounds: the C one, or trio's (where the C half is not built)."""
    if request.param == "threads":
        monkeypatch.setattr(flusher_module, "native", None)
    else:
        assert flusher_module.native is not None, "dledger.log._sync_native is not built"
    return str(request.param)


async def appender(store: LogStore, flusher: Flusher, done: list[int]) -> None:
    for _ in range(APPENDS_EACH):
        index = append_one(store, flusher, size=200)
        assert await flusher.wait_durable(index) >= index
        assert store.durable_index >= index
        done.append(index)


async def test_concurrent_appenders_share_fsyncs(tmp_path: Path) -> None:
    reported: list[int] = []
    with open_store(tmp_path, SMALL) as store:
        flusher = Flusher(store, on_durable=reported.append)
        done: list[int] = []
        async with trio.open_nursery() as nursery:
            await nursery.start(flusher.run)
            async with trio.open_nursery() as appenders:
                for _ in range(APPENDERS):
                    appenders.start_soon(appender, store, flusher, done)
            nursery.cancel_scope.cancel()
        appends = APPENDERS * APPENDS_EACH
        assert sorted(done) == list(range(1, appends + 1))
        assert store.durable_index == appends
        # Every appender waits for its fsync before appending again, so each flush serves
        # up to 64 appends; allow slack for scheduling, but far fewer than one per append.
        assert store.flushes <= appends // 8, (store.flushes, appends)
        assert reported == sorted(reported) and reported[-1] == appends


async def test_async_flush_runs_on_its_interval(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    with open_store(tmp_path, ASYNC_SMALL) as store:
        flusher = Flusher(store)
        async with trio.open_nursery() as nursery:
            await nursery.start(flusher.run)
            store.append(batch_of(1, 1, 1, size=10))
            flusher.notify()
            began = trio.current_time()
            assert await flusher.wait_durable(1) == 1
            waited_ms = (trio.current_time() - began) * 1000
            assert waited_ms >= ASYNC_SMALL.flush_interval_ms  # it waited for the interval
            assert store.flushes == 1
            nursery.cancel_scope.cancel()


async def async_flush_wait_ms(store: LogStore, entries: int) -> float:
    """Append `entries` of 1000 bytes under a running Flusher; ms until they are durable."""
    flusher = Flusher(store)
    async with trio.open_nursery() as nursery:
        await nursery.start(flusher.run)
        store.append(batch_of(1, 1, entries, size=1000))
        flusher.notify()
        began = trio.current_time()
        assert await flusher.wait_durable(entries) == entries
        nursery.cancel_scope.cancel()
    return (trio.current_time() - began) * 1000


async def test_async_flush_starts_once_least_pages_are_dirty(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    config = attrs.evolve(ASYNC_SMALL, flush_least_pages=4)
    with open_store(tmp_path, config) as store:
        waited_ms = await async_flush_wait_ms(store, 20)  # 20 KB: more than 4 pages
        assert waited_ms < config.flush_interval_ms / 4  # the append woke the flusher
        assert store.flushes == 1


async def test_timed_async_flush_waits_for_the_interval(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    config = attrs.evolve(ASYNC_SMALL, flush_least_pages=4, flush_timed=True)
    with open_store(tmp_path, config) as store:
        waited_ms = await async_flush_wait_ms(store, 20)
        assert waited_ms >= config.flush_interval_ms  # appends do not wake a timed flusher
        assert store.flushes == 1


async def test_waiters_below_durable_return_at_once(tmp_path: Path) -> None:
    with open_store(tmp_path, SMALL) as store:
        store.append(batch_of(1, 1, 3))
        store.flush()
        assert await Flusher(store).wait_durable(2) == 3


async def test_flush_once_and_prepare(tmp_path: Path) -> None:
    with open_store(tmp_path, SMALL) as store:
        flusher = Flusher(store)
        store.append(batch_of(1, 1, 2))
        assert await flusher.flush_once() == 2
        assert await flusher.flush_once() == 2  # nothing dirty: no ticket
        assert store.flushes == 1
        assert not store.segment_prepare_due  # the segment is not half written yet
        store.append(batch_of(3, 1, 40, size=1000))  # now it is
        async with trio.open_nursery() as nursery:
            await nursery.start(flusher.run)
            flusher.notify()
            with trio.fail_after(10):  # the prepare runs in a thread: poll with a deadline
                while store.segment_prepare_due:
                    await trio.sleep(0.001)
            assert len(list(store.paths.data.iterdir())) == 2  # made ahead of time
            nursery.cancel_scope.cancel()


async def test_a_cancelled_waiter_is_skipped(tmp_path: Path) -> None:
    with open_store(tmp_path, SMALL) as store:
        flusher = Flusher(store)
        released: list[int] = []
        gone = trio.CancelScope()

        async def wait(index: int, scope: trio.CancelScope) -> None:
            with scope:
                released.append(await flusher.wait_durable(index))

        async with trio.open_nursery() as waiters:
            waiters.start_soon(wait, 1, gone)
            waiters.start_soon(wait, 1, trio.CancelScope())
            waiters.start_soon(wait, 2, trio.CancelScope())
            await trio.testing.wait_all_tasks_blocked()
            gone.cancel()  # the first waiter for entry 1 leaves before any flush
            await trio.testing.wait_all_tasks_blocked()
            store.append(batch_of(1, 1, 2))
            assert await flusher.flush_once() == 2
        assert gone.cancelled_caught
        assert released == [2, 2]  # the two left, each released once


async def test_a_waiter_for_a_truncated_entry_waits_for_its_successor(tmp_path: Path) -> None:
    with open_store(tmp_path, SMALL) as store:
        flusher = Flusher(store)
        store.append(batch_of(1, 1, 3))
        async with trio.open_nursery() as nursery:
            nursery.start_soon(flusher.wait_durable, 3)
            await trio.testing.wait_all_tasks_blocked()
            store.truncate_after(1)  # entry 3 is gone before any fsync saw it
            assert await flusher.flush_once() == 1
            await trio.testing.wait_all_tasks_blocked()
            assert len(nursery.child_tasks) == 1  # still waiting: index 3 is not durable
            store.append(batch_of(2, 2, 2))
            assert await flusher.flush_once() == 3
        assert store.durable_index == 3


async def fails_with(flusher: Flusher, index: int, code: int) -> None:
    """Run the flusher and wait for `index` to be durable: its run() raises OSError(`code`)
    instead, and the waiter is never released."""
    with pytest.RaisesGroup(
        pytest.RaisesExc(OSError, check=lambda e: e.errno == code), flatten_subgroups=True
    ):
        async with trio.open_nursery() as nursery:
            await nursery.start(flusher.run)
            flusher.notify()
            await flusher.wait_durable(index)


async def test_a_failed_fsync_stops_the_flusher(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def eio(fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    with open_store(tmp_path, SMALL) as store:
        flusher = Flusher(store)
        store.append(batch_of(1, 1, 1))
        monkeypatch.setattr(os, "fdatasync", eio)
        await fails_with(flusher, 1, errno.EIO)
        assert store.durable_index == 0
        monkeypatch.undo()  # before the store closes: close() flushes what is dirty


async def test_a_failed_round_of_data_files_stops_the_flusher(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fsync_path: str
) -> None:
    """A round that syncs files only (no directory) goes to the C thread when it is built; its
    errno comes back as the OSError os.fdatasync raises on trio's threads. A pipe among the
    ticket's descriptors makes fdatasync fail (EINVAL) on either."""
    read_end, write_end = os.pipe()
    tickets: list[FlushTicket] = []
    with open_store(tmp_path, SMALL) as store:
        store.append(batch_of(1, 1, 1))
        store.flush()  # the store's new files and their directory entries: synced here
        real_begin = store.begin_flush

        def begin_flush() -> FlushTicket | None:
            ticket = real_begin()
            if ticket is not None:
                ticket.fds.append(os.dup(read_end))
                tickets.append(ticket)
            return ticket

        monkeypatch.setattr(store, "begin_flush", begin_flush)
        if fsync_path == "native":

            def not_here(self: FlushTicket) -> None:
                raise AssertionError("a round of files only ran on a Python thread")

            monkeypatch.setattr(FlushTicket, "run", not_here)
        flusher = Flusher(store)
        store.append(batch_of(2, 1, 1))
        await fails_with(flusher, 2, errno.EINVAL)
        assert store.durable_index == 1
        assert len(tickets) == 1 and not tickets[0].directories and tickets[0].ran
        monkeypatch.undo()
    os.close(read_end)
    os.close(write_end)


async def test_an_error_in_on_durable_stops_the_flusher(tmp_path: Path) -> None:
    """The round lands in trio's run_sync_soon task, which must not raise: the error goes
    to run(), which raises it, as it does a failed fsync's."""

    def broken(durable: int) -> None:
        raise RuntimeError(f"owner failed at {durable}")

    with open_store(tmp_path, SMALL) as store:
        flusher = Flusher(store, on_durable=broken)
        with pytest.RaisesGroup(
            pytest.RaisesExc(RuntimeError, match="owner failed at 1"), flatten_subgroups=True
        ):
            async with trio.open_nursery() as nursery:
                await nursery.start(flusher.run)
                append_one(store, flusher)
                await flusher.wait_durable(1)  # released before the callback raised
                await trio.sleep_forever()  # until run() raises
        assert store.durable_index == 1


async def test_a_cancelled_run_waits_for_its_round(tmp_path: Path) -> None:
    """Begun tickets always complete: cancelling run() while a round is in its thread waits
    for it to land, so the thread never reports to a finished trio run."""
    with open_store(tmp_path, SMALL) as store:
        flusher = Flusher(store)
        async with trio.open_nursery() as nursery:
            await nursery.start(flusher.run)
            append_one(store, flusher)  # starts the round at once
            nursery.cancel_scope.cancel()
        assert store.durable_index == 1
        assert store.flushes == 1


async def test_appends_during_a_round_are_taken_by_the_next(tmp_path: Path) -> None:
    """A round starts at the first append; what is appended while it runs waits for the
    round that starts when it lands, one round for all of them."""
    with open_store(tmp_path, SMALL) as store:
        flusher = Flusher(store)
        async with trio.open_nursery() as nursery:
            await nursery.start(flusher.run)
            append_one(store, flusher)
            for _ in range(4):  # the first round is in its thread: these wait
                append_one(store, flusher)
            assert await flusher.wait_durable(5) == 5
            assert store.flushes == 2
            nursery.cancel_scope.cancel()
