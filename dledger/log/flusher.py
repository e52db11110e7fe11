"""Group commit: one trio task that fsyncs a LogStore for everyone who appended to it.

Appenders write synchronously (LogStore.append), call `notify()`, and `await
wait_durable(index)`. The flush task captures whatever is dirty at that moment, fsyncs it in
a worker thread while appends go on, then releases every waiter the fsync covered: with many
concurrent appenders, one fsync serves all the entries written while the previous one ran.
Under ASYNC_FLUSH the same task flushes in the background: an append that leaves
flush_least_pages dirty wakes it, and it looks on its own four times per flush_interval_ms
to flush whatever the interval left dirty (with `flush_timed`, appends do not wake it and it
flushes at most once per interval). Waiters then wait for that background flush.

The round trip is kept lean because with one-entry appenders it is paid per round, and each
round serves only the appenders that waited for it: a ticket goes to one of trio's cached
threads (`start_thread_soon`, without `to_thread`'s limiter and context copy), and waiters
sit in a heap by index and are rescheduled directly, not through an Event each loops on.

A second task creates the next segment ahead of time (LogStore.prepare_next_segment) so the
append path never waits for a file to be created and preallocated.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable

import outcome
import trio

from dledger import limits
from dledger.log.durability import FlushTicket
from dledger.log.store import FlushPolicy, LogStore

MS_PER_S = 1000


class Flusher:
    """Owns the flushing of one store; run() inside the owner's nursery."""

    def __init__(self, store: LogStore, *, on_durable: Callable[[int], None] | None = None) -> None:
        """`on_durable(durable_index)` is called on the loop after every flush that raised it
        (the node tells the Raft core `Persisted` from there and releases its acks)."""
        self.store = store
        self._on_durable = on_durable
        self._wake = trio.Event()
        self._periodic = store.config.flush is FlushPolicy.ASYNC_FLUSH
        self._woken_by_appends = not (self._periodic and store.config.flush_timed)
        self._prepare_wake = trio.Event()
        # Waiters by index: (index, arrival, [task]); the task is None once the wait was
        # cancelled. Arrivals are unique, so the heap never compares the task cells.
        self._waiters: list[tuple[int, int, list[trio.lowlevel.Task | None]]] = []
        self._arrivals = itertools.count()

    def notify(self) -> None:
        """Something was appended or truncated: under SYNC_FLUSH the flush task looks at once;
        under ASYNC_FLUSH once flush_least_pages are dirty, or (flush_timed) on its timer."""
        if self._woken_by_appends and (not self._periodic or self.store.flush_wanted):
            self._wake.set()

    async def wait_durable(self, index: int) -> int:
        """Return once durable_index >= index (the entry is fsynced); returns durable_index.

        A waiter is released by the first flush that covers its index; one whose entry was
        truncated meanwhile waits until a later flush covers the index again."""
        store = self.store
        if store.durable_index >= index:
            return store.durable_index
        cell: list[trio.lowlevel.Task | None] = [trio.lowlevel.current_task()]
        heapq.heappush(self._waiters, (index, next(self._arrivals), cell))
        self._wake.set()

        def abort(_: object) -> trio.lowlevel.Abort:
            cell[0] = None  # left in the heap; skipped when its index is reached
            return trio.lowlevel.Abort.SUCCEEDED

        await trio.lowlevel.wait_task_rescheduled(abort)
        return store.durable_index

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Flush and prepare segments until cancelled. A failed fsync raises out of here: the
        owner must stop, since after EIO the kernel may have dropped the dirty pages."""
        if self.store.segment_prepare_due:
            self._prepare_wake.set()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._prepare_segments)
            task_status.started()
            await self._flush_loop()

    async def _flush_loop(self) -> None:
        store = self.store
        # ASYNC_FLUSH looks four times per interval, so a flush comes at most a quarter
        # interval late; flush_due decides whether one is due.
        poll_s = store.config.flush_interval_ms / MS_PER_S / 4
        while True:
            now_ms = int(trio.current_time() * MS_PER_S)
            if not store.flush_due(now_ms):
                if self._periodic:
                    with trio.move_on_after(poll_s):
                        await self._wake.wait()
                else:
                    await self._wake.wait()
                self._wake = trio.Event()
                continue
            if not self._periodic and store.index_sync_pending and not store.has_data_dirty:
                # SYNC_FLUSH, idle but for index records a round left behind: sync them once
                # their interval is up, unless an append comes first (its round takes them)
                with trio.move_on_after(limits.INDEX_SYNC_INTERVAL_MS / MS_PER_S) as waited:
                    await self._wake.wait()
                self._wake = trio.Event()
                if not waited.cancelled_caught:
                    continue
            await self.flush_once()

    async def flush_once(self) -> int:
        """One group commit now, whatever the policy; returns durable_index."""
        store = self.store
        before = store.durable_index
        ticket = store.begin_flush()
        if ticket is None:
            return before
        with trio.CancelScope(shield=True):  # begun tickets always complete
            (await _run_in_thread(ticket)).unwrap()
            durable = store.complete_flush(ticket)
        if durable > before:
            self._release(durable)
            if self._on_durable is not None:
                self._on_durable(durable)
        if store.segment_prepare_due:
            self._prepare_wake.set()
        return durable

    def _release(self, durable: int) -> None:
        waiters = self._waiters
        while waiters and waiters[0][0] <= durable:
            task = heapq.heappop(waiters)[2][0]
            if task is not None:
                trio.lowlevel.reschedule(task)

    async def _prepare_segments(self) -> None:
        while True:
            if self.store.segment_prepare_due:
                # Abandoned on cancel: the owner's close() ends the page loading early
                # (LogWriter.prepare_next_segment), so a shutdown need not wait for it.
                await trio.to_thread.run_sync(
                    self.store.prepare_next_segment, abandon_on_cancel=True
                )
            else:
                await self._prepare_wake.wait()
                self._prepare_wake = trio.Event()


async def _run_in_thread(ticket: FlushTicket) -> outcome.Outcome[None]:
    """ticket.run() in one of trio's cached threads; its outcome, once it is back."""
    token = trio.lowlevel.current_trio_token()
    task = trio.lowlevel.current_task()

    def deliver(result: outcome.Outcome[None]) -> None:  # in the worker thread
        token.run_sync_soon(trio.lowlevel.reschedule, task, outcome.Value(result))

    trio.lowlevel.start_thread_soon(ticket.run, deliver)
    result: outcome.Outcome[None] = await trio.lowlevel.wait_task_rescheduled(
        lambda _: trio.lowlevel.Abort.FAILED
    )
    return result
