"""Handing pulled messages to the listener, and what its answer does to offsets.

Concurrent (`ConcurrentConsumeService`): `workers` tasks take batches (`consume_batch_size`
messages of one queue) from a bounded channel, in any order across and within queues.
CONSUME_SUCCESS removes the batch from its process queue and sets the queue's offset to the
lowest offset still held, so a crash re-delivers and never skips. RECONSUME_LATER: in
clustering mode each message is offered back to the broker (CONSUMER_SEND_MSG_BACK; a broker
that takes it re-delivers it through %RETRY%<group>, so it counts as consumed here); what no
broker takes is retried locally after a capped, doubling pause, for as long as it takes
(client/push_config.py explains why).

Orderly (`OrderlyConsumeService`): one task per queue with messages, taking batches in offset
order, one at a time; a batch runs only while the queue's broker lock is held (clustering).
SUCCESS commits the batch; SUSPEND_CURRENT_QUEUE_A_MOMENT puts it back at the front and pauses
the queue for `suspend_s`. At most `workers` queues run their listener at once.

A plain-function listener runs in a worker thread (trio.to_thread with a CapacityLimiter of
`workers`), so a slow one never blocks the loop; an `async def` one is awaited.
"""

from __future__ import annotations

import inspect
import logging
import math
from collections.abc import Awaitable, Callable
from typing import Any

import attrs
import trio

from client.consumer_requests import ConsumerRequests
from client.listeners import ConsumeOrderlyStatus, ConsumeStatus
from client.message import MessageExt
from client.offset_store import OffsetStore
from client.process_queue import ProcessQueue
from client.push_config import PushConfig
from remoting.codes import ResponseCode

log = logging.getLogger("client.consume")

BATCHES_QUEUED_MAX = 4096  # batches waiting for a worker; a full channel holds back the pulls
SEND_BACK_RECHECK_S = 60.0  # after a broker said it does not serve CONSUMER_SEND_MSG_BACK
LOCK_RETRY_S = 0.5  # an orderly queue whose lock is not held asks for it again this often

Runner = Callable[[list[MessageExt]], Awaitable[object]]
Locker = Callable[[ProcessQueue], Awaitable[bool]]


def is_async(fn: Callable[..., Any]) -> bool:
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None)  # noqa: B004 (an object with an async __call__)
    )


def listener_runner(fn: Callable[[list[MessageExt]], Any], threads: trio.CapacityLimiter) -> Runner:
    """An awaitable call of the listener: awaited if async, else in a worker thread."""
    if is_async(fn):

        async def run_async(batch: list[MessageExt]) -> object:
            return await fn(batch)

        return run_async

    async def run_in_thread(batch: list[MessageExt]) -> object:
        return await trio.to_thread.run_sync(fn, batch, limiter=threads, abandon_on_cancel=True)

    return run_in_thread


async def call_listener(run: Runner, batch: list[MessageExt], success: object) -> bool:
    """Whether the listener answered `success`; an exception or another answer is a failure."""
    try:
        status = await run(list(batch))
    except Exception:
        log.exception("the listener raised on %d message(s) from %s", len(batch), batch[0].queue)
        return False
    if status is not success:
        if not isinstance(status, ConsumeStatus | ConsumeOrderlyStatus):
            log.warning("the listener answered %r, not a status: counted as a failure", status)
        return False
    return True


def reconsumed(messages: list[MessageExt]) -> list[MessageExt]:
    """The same messages, reconsume_times counted up (for their next delivery)."""
    return [attrs.evolve(m, reconsume_times=m.reconsume_times + 1) for m in messages]


def _nothing() -> None:
    return None


@attrs.define
class ConsumeContext:
    group: str
    config: PushConfig
    requests: ConsumerRequests
    offsets: OffsetStore
    # called after a broker took messages back: the consumer makes sure it pulls its retry topic
    sent_back: Callable[[], None] = _nothing


def commit(ctx: ConsumeContext, pq: ProcessQueue, offset: int | None) -> None:
    """The queue's offset moves to `offset`, unless the queue was handed on already."""
    if offset is not None and not pq.released:
        ctx.offsets.update(pq.queue, offset)


class ConcurrentConsumeService:
    def __init__(self, ctx: ConsumeContext, listener: Callable[[list[MessageExt]], Any]) -> None:
        self._ctx = ctx
        self._threads = trio.CapacityLimiter(ctx.config.workers)
        self._run = listener_runner(listener, self._threads)
        self._send, self._receive = trio.open_memory_channel[tuple[ProcessQueue, list[MessageExt]]](
            BATCHES_QUEUED_MAX
        )
        self._nursery: trio.Nursery | None = None
        self._no_send_back_until: dict[str, float] = {}  # broker name -> trio time

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            for _ in range(self._ctx.config.workers):
                nursery.start_soon(self._worker)
            task_status.started()

    async def submit(self, pq: ProcessQueue, messages: list[MessageExt]) -> None:
        size = self._ctx.config.consume_batch_size
        for at in range(0, len(messages), size):
            await self._send.send((pq, messages[at : at + size]))

    async def _worker(self) -> None:
        async for pq, batch in self._receive:
            if pq.dropped:
                continue  # the queue went elsewhere: its new owner delivers these
            pq.begin_batch()
            try:
                ok = await call_listener(self._run, batch, ConsumeStatus.CONSUME_SUCCESS)
                if ok:
                    commit(self._ctx, pq, pq.remove(batch))
                else:
                    await self._later(pq, batch)
            finally:
                pq.end_batch()

    async def _later(self, pq: ProcessQueue, batch: list[MessageExt]) -> None:
        failed = batch
        if self._ctx.config.clustering:
            taken = [m for m in batch if await self._send_back(m)]
            if taken:
                commit(self._ctx, pq, pq.remove(taken))
                self._ctx.sent_back()
            failed = [m for m in batch if m not in taken]
        if failed and not pq.dropped:
            again = reconsumed(failed)
            pq.replace(again)
            delay = self._ctx.config.retry_delay(failed[0].reconsume_times)
            log.info(
                "%d message(s) of %s to be consumed again in %.1f s (attempt %d)",
                len(again),
                pq.queue,
                delay,
                again[0].reconsume_times + 1,
            )
            assert self._nursery is not None
            self._nursery.start_soon(self._retry_after, pq, again, delay)

    async def _retry_after(self, pq: ProcessQueue, batch: list[MessageExt], delay: float) -> None:
        await trio.sleep(delay)
        if not pq.dropped:
            await self._send.send((pq, batch))

    async def _send_back(self, message: MessageExt) -> bool:
        broker = message.queue.broker_name
        if trio.current_time() < self._no_send_back_until.get(broker, -math.inf):
            return False
        code = await self._ctx.requests.send_back(
            self._ctx.group,
            message,
            delay_level=self._ctx.config.send_back_delay_level,
            max_reconsume_times=self._ctx.config.max_reconsume_times,
        )
        if code == ResponseCode.SUCCESS:
            return True
        if code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED:
            log.info(
                "%s does not take messages back (CONSUMER_SEND_MSG_BACK): retrying locally", broker
            )
            self._no_send_back_until[broker] = trio.current_time() + SEND_BACK_RECHECK_S
        return False


class OrderlyConsumeService:
    def __init__(
        self,
        ctx: ConsumeContext,
        listener: Callable[[list[MessageExt]], Any],
        locker: Locker | None,
    ) -> None:
        """`locker` makes sure a queue's broker lock is held (clustering); None: no locks."""
        self._ctx = ctx
        self._threads = trio.CapacityLimiter(ctx.config.workers)
        self._slots = trio.CapacityLimiter(ctx.config.workers)
        self._run = listener_runner(listener, self._threads)
        self._locker = locker
        self._active: set[ProcessQueue] = set()
        self._nursery: trio.Nursery | None = None

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            await trio.sleep_forever()

    async def submit(self, pq: ProcessQueue, messages: list[MessageExt]) -> None:
        if pq not in self._active and not pq.dropped:
            assert self._nursery is not None
            self._active.add(pq)
            self._nursery.start_soon(self._consume_queue, pq)

    async def _consume_queue(self, pq: ProcessQueue) -> None:
        try:
            while not pq.dropped:
                locker = self._locker
                if (
                    locker is not None
                    and not pq.lock_valid(trio.current_time())
                    and not await locker(pq)
                ):
                    await trio.sleep(LOCK_RETRY_S)  # never consume without the lock
                    continue
                batch = pq.take(self._ctx.config.consume_batch_size)
                if not batch:
                    return
                pq.begin_batch()
                try:
                    async with self._slots:
                        ok = await call_listener(self._run, batch, ConsumeOrderlyStatus.SUCCESS)
                    if ok:
                        commit(self._ctx, pq, pq.commit_taken())
                    else:
                        pq.return_taken(reconsumed(batch))
                finally:
                    pq.end_batch()
                if not ok:
                    await trio.sleep(self._ctx.config.suspend_s)
        finally:
            self._active.discard(pq)
