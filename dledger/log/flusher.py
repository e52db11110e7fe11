"""Group commit with trio: one flush round at a time fsyncs a LogStore for everyone who
appended to it.

Appenders write synchronously (LogStore.append), call `notify()`, and `await
wait_durable(index)`. A round captures whatever is dirty at that moment (`begin_flush`),
fsyncs it in a worker thread while appends go on, then releases every waiter the fsync
covered: with many concurrent appenders, one fsync serves all the entries written while the
previous one ran. Under ASYNC_FLUSH the same rounds run in the background: an append that
leaves flush_least_pages dirty starts one, and a timer looks four times per flush_interval_ms
to flush whatever the interval left dirty (with `flush_timed`, appends do not start rounds and
it flushes at most once per interval).

No task waits between the steps of a round, because under SYNC_FLUSH a round runs for every
append on every replica and each scheduler pass costs as much as the fsync's own CPU: the
append that finds no round running starts one itself (`notify`), and the ticket goes to the C
fsync thread (`Syncer`, dledger/log/sync_native.c, which never takes the GIL; its eventfd wakes
the one landing task) or, for a round that fsyncs a directory or where the C half is not built,
to one of trio's cached threads (`start_thread_soon`, without `to_thread`'s limiter and context
copy), whose result lands in a `run_sync_soon` callback on the loop. Landing completes the
ticket, reschedules the waiters it covered (a heap by index, not an Event each loops on),
reports the durable index and starts the next round if one is due. A failed round (EIO) is
handed to `run()`, which raises it: the owner must stop. `run()` also keeps the timers (the
ASYNC_FLUSH interval, index records a SYNC_FLUSH round left behind) and a second task that
creates the next segment ahead of time (LogStore.prepare_next_segment), so the append path
never waits for a file to be created and preallocated.
"""

from __future__ import annotations

import heapq
import itertools
import os
from collections.abc import Callable
from typing import Any

import outcome
import trio

from dledger import limits
from dledger.log.durability import FlushTicket
from dledger.log.store import FlushPolicy, LogStore
from netio.native import optional_extension

MS_PER_S = 1000

# fsync rounds on a thread that never takes the GIL (dledger/log/sync_native.c), or None:
# trio's worker threads then run them
native = optional_extension("dledger.log._sync_native")


class Flusher:
    """Owns the flushing of one store; run() inside the owner's nursery."""

    def __init__(self, store: LogStore, *, on_durable: Callable[[int], None] | None = None) -> None:
        """`on_durable(durable_index)` is called on the loop after every flush that raised it
        (the node tells the Raft core `Persisted` from there and releases its acks); it must
        not block and should not raise (an error stops the flusher as a failed fsync does)."""
        self.store = store
        self._on_durable = on_durable
        self._periodic = store.config.flush is FlushPolicy.ASYNC_FLUSH
        self._woken_by_appends = not (self._periodic and store.config.flush_timed)
        self._prepare_wake = trio.Event()
        # Waiters by index: (index, arrival, [task]); the task is None once the wait was
        # cancelled. Arrivals are unique, so the heap never compares the task cells.
        self._waiters: list[tuple[int, int, list[trio.lowlevel.Task | None]]] = []
        self._arrivals = itertools.count()
        self._running = False  # run() is on: appends and waiters start rounds
        self._round: trio.Event | None = None  # set when the round in flight has landed
        self._failure: BaseException | None = None
        self._failed = trio.Event()
        self._index_left = trio.Event()  # SYNC_FLUSH: a round left only index records dirty
        self._poll: trio.CancelScope | None = None  # ASYNC_FLUSH: the timer's current sleep
        self._syncer: Any = None  # run()'s native Syncer, while it runs
        self._native_ticket: FlushTicket | None = None  # the round the Syncer has

    def notify(self) -> None:
        """Something was appended or truncated: under SYNC_FLUSH a round starts now unless
        one runs (it starts the next when it lands); under ASYNC_FLUSH once flush_least_pages
        are dirty, or (flush_timed) on the timer."""
        if self._woken_by_appends and (not self._periodic or self.store.flush_wanted):
            self._start_if_due()

    async def wait_durable(self, index: int) -> int:
        """Return once durable_index >= index (the entry is fsynced); returns durable_index.

        A waiter is released by the first flush that covers its index; one whose entry was
        truncated meanwhile waits until a later flush covers the index again."""
        store = self.store
        if store.durable_index >= index:
            return store.durable_index
        cell: list[trio.lowlevel.Task | None] = [trio.lowlevel.current_task()]
        heapq.heappush(self._waiters, (index, next(self._arrivals), cell))
        self._start_if_due()

        def abort(_: object) -> trio.lowlevel.Abort:
            cell[0] = None  # left in the heap; skipped when its index is reached
            return trio.lowlevel.Abort.SUCCEEDED

        await trio.lowlevel.wait_task_rescheduled(abort)
        return store.durable_index

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Flush and prepare segments until cancelled. A failed fsync raises out of here: the
        owner must stop, since after EIO the kernel may have dropped the dirty pages. On
        cancel it waits for the round in flight (begun tickets always complete)."""
        if self.store.segment_prepare_due:
            self._prepare_wake.set()
        syncer = self._syncer = native.Syncer() if native is not None else None
        self._running = True
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._prepare_segments)
                nursery.start_soon(self._timer)
                if syncer is not None:
                    nursery.start_soon(self._land_native, syncer)
                task_status.started()
                self._start_if_due()
                await self._failed.wait()
                assert self._failure is not None
                raise self._failure
        finally:
            self._running = False
            with trio.CancelScope(shield=True):
                while self._round is not None:
                    if self._native_ticket is not None:
                        assert syncer is not None
                        await self._land_native_once(syncer)
                    else:
                        await self._round.wait()
            self._syncer = None
            if syncer is not None:
                syncer.close()

    async def flush_once(self) -> int:
        """One group commit now, whatever the policy (after the round in flight, if any);
        returns durable_index."""
        await self._landed()
        before = self.store.durable_index
        if self._start() is None:
            return before
        with trio.CancelScope(shield=True):  # begun tickets always complete
            await self._landed()
        return self.store.durable_index

    async def _landed(self) -> None:
        """Until no round is in flight; raises the failure of one that failed."""
        while self._round is not None:
            await self._round.wait()
        if self._failure is not None:
            raise self._failure

    def _start_if_due(self) -> None:
        if not self._running or self._round is not None or self._failure is not None:
            return
        store = self.store
        if not store.flush_due(int(trio.current_time() * MS_PER_S)):
            return
        if not self._periodic and not store.has_data_dirty:
            return  # index records alone: the timer syncs them when due (durability.py)
        self._start()

    def _start(self) -> FlushTicket | None:
        """Begin a round now: capture what is dirty and fsync it in a worker thread."""
        ticket = self.store.begin_flush()
        if ticket is None:
            return None
        self._round = trio.Event()
        if self._poll is not None:
            self._poll.cancel()
        syncer = self._syncer
        if syncer is not None and not ticket.directories:  # a directory: rare, Python's
            self._native_ticket = ticket
            syncer.submit(ticket.fds, ticket.releases)  # its descriptors are the Syncer's now
            ticket.releases = []
            return ticket
        token = trio.lowlevel.current_trio_token()

        def deliver(result: outcome.Outcome[None]) -> None:  # in the worker thread
            token.run_sync_soon(self._land, ticket, result)

        trio.lowlevel.start_thread_soon(ticket.run, deliver)
        return ticket

    def _land(self, ticket: FlushTicket, result: outcome.Outcome[None]) -> None:
        """On the loop, in trio's run_sync_soon task: it must not raise."""
        landed, self._round = self._round, None
        try:
            result.unwrap()
            store = self.store
            before = store.durable_index
            durable = store.complete_flush(ticket)
            if durable > before:
                self._release(durable)
                if self._on_durable is not None:
                    self._on_durable(durable)
            if store.segment_prepare_due:
                self._prepare_wake.set()
            self._start_if_due()
            if self._round is None and not self._periodic and store.index_sync_pending:
                self._index_left.set()
        except BaseException as err:  # EIO from the fsync, or the owner's callback
            self._failure = err
            self._failed.set()
        assert landed is not None
        landed.set()

    async def _land_native(self, syncer: Any) -> None:
        """Lands the Syncer's rounds, one after another."""
        while True:
            await self._land_native_once(syncer)

    async def _land_native_once(self, syncer: Any) -> None:
        """Waits for the Syncer's descriptor (readable when a round is done) and lands the
        round if it is done."""
        await trio.lowlevel.wait_readable(syncer.fileno())
        error = syncer.collect()
        if error is None:
            return  # woken early: not done yet
        ticket, self._native_ticket = self._native_ticket, None
        assert ticket is not None
        ticket.ran = True
        if error:
            result: outcome.Outcome[None] = outcome.Error(OSError(error, os.strerror(error)))
        else:
            ticket.fsyncs = len(ticket.fds)
            result = outcome.Value(None)
        self._land(ticket, result)

    def _release(self, durable: int) -> None:
        waiters = self._waiters
        while waiters and waiters[0][0] <= durable:
            task = heapq.heappop(waiters)[2][0]
            if task is not None:
                trio.lowlevel.reschedule(task)

    async def _timer(self) -> None:
        """ASYNC_FLUSH looks four times per interval, so a flush comes at most a quarter
        interval late (flush_due decides whether one is due). SYNC_FLUSH syncs the index
        records a round left behind with nothing else dirty once their interval is up,
        unless a round (which takes them when due) comes first."""
        store = self.store
        while True:
            if self._periodic:
                if self._round is not None:  # no deadline while a round runs (mock clocks)
                    await self._round.wait()
                    continue
                with trio.CancelScope() as self._poll:  # a round started cancels it
                    await trio.sleep(store.config.flush_interval_ms / MS_PER_S / 4)
                self._poll = None
                self._start_if_due()
                continue
            await self._index_left.wait()
            self._index_left = trio.Event()
            await trio.sleep(limits.INDEX_SYNC_INTERVAL_MS / MS_PER_S)
            if self._round is None and self._failure is None and store.index_sync_pending:
                self._start()

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
