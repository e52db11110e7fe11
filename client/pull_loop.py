"""One owned queue's pull loop: long-polling pulls into its process queue.

Per round: (orderly clustering) the queue's broker lock must be held; the start offset is
learnt once (the group's committed offset, else `consume_from`: "last" GET_MAX_OFFSET, "first"
GET_MIN_OFFSET, a timestamp SEARCH_OFFSET_BY_TIMESTAMP; a %RETRY% queue starts at its first);
flow control may hold the loop (client/process_queue.py); then PULL_MESSAGE with the suspend
flag (the broker holds it up to `long_poll_s` when nothing is new), the subscription, and in
clustering mode the offset to commit piggy-backed (sysFlag 1).

An answer's nextBeginOffset is where the next pull starts: the loop never moves past what a
broker answered. FOUND messages (after the client's tag filter) go to the process queue and the
consume service; NO_NEW_MSG and NO_MATCHED_MSG move on; OFFSET_ILLEGAL moves to the offset the
broker names, logged. A failed pull (every replica tried, client/consumer_requests.py) waits a
doubling pause from PULL_BACKOFF_S_MIN to PULL_BACKOFF_S_MAX and tries again.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Protocol

import attrs
import trio

from client.consumer_requests import ConsumerRequests
from client.errors import MQClientError
from client.message import MessageExt, MessageQueue
from client.offset_store import OffsetStore
from client.process_queue import FlowLimits, ProcessQueue
from client.pull_consumer import PullStatus, pull_result
from client.push_config import PushConfig
from client.subscription import Subscription
from remoting import properties as props
from remoting.codes import RequestCode

log = logging.getLogger("client.pull_loop")

RETRY_PREFIX = "%RETRY%"
PULL_TIMEOUT_MARGIN_S = 5.0  # a held pull's request timeout: the hold plus this
PULL_BACKOFF_S_MIN = 0.1  # the pause after a failed pull, doubling per failure ...
PULL_BACKOFF_S_MAX = 3.0  # ... up to RocketMQ's pullTimeDelayMillsWhenException
LOCK_RETRY_S = 0.5  # an orderly queue without its lock asks again this often
EMPTY_ANSWER_S_MIN = 0.05  # NO_NEW_MSG quicker than this twice running: the broker did not hold it


class Consumer(Protocol):
    async def submit(self, pq: ProcessQueue, messages: list[MessageExt]) -> None: ...


def restore_topic(messages: list[MessageExt]) -> list[MessageExt]:
    """Messages pulled from %RETRY%<group> carry their own topic in RETRY_TOPIC; the listener
    sees that one (RocketMQ's resetRetryAndNamespace). Their queue stays the retry queue."""
    return [
        attrs.evolve(m, topic=m.properties[props.RETRY_TOPIC])
        if props.RETRY_TOPIC in m.properties
        else m
        for m in messages
    ]


class PullLoop:
    def __init__(
        self,
        group: str,
        config: PushConfig,
        requests: ConsumerRequests,
        offsets: OffsetStore,
        consumer: Consumer,
        flow: FlowLimits,
        locker: Callable[[ProcessQueue], Awaitable[bool]] | None,
    ) -> None:
        self._group = group
        self._config = config
        self._requests = requests
        self._offsets = offsets
        self._consumer = consumer
        self._flow = flow
        self._locker = locker

    async def start_offset(self, queue: MessageQueue) -> int:
        """The committed offset, else where consume_from says."""
        stored = await self._offsets.read_stored(queue)
        if stored is not None and stored >= 0:
            return stored
        consume_from = self._config.consume_from
        if queue.topic.startswith(RETRY_PREFIX) or consume_from == "first":
            return await self._requests.queue_offset(RequestCode.GET_MIN_OFFSET, queue)
        if consume_from == "last":
            return await self._requests.queue_offset(RequestCode.GET_MAX_OFFSET, queue)
        _, timestamp_ms = consume_from
        return await self._requests.search_offset(queue, timestamp_ms)

    async def run(self, pq: ProcessQueue, subscription: Subscription) -> None:
        """Pull until the queue is dropped (the caller also cancels the loop then)."""
        queue = pq.queue
        failures = 0
        quick_empty = 0
        prefer_id: int | None = None
        waiting_logged = False
        while not pq.dropped:
            if failures:
                await trio.sleep(min(PULL_BACKOFF_S_MIN * 2 ** (failures - 1), PULL_BACKOFF_S_MAX))
            if self._locker is not None and not await self._locker(pq):
                await trio.sleep(LOCK_RETRY_S)
                continue
            if pq.pulled_to is None:
                try:
                    start = await self.start_offset(queue)
                except MQClientError as err:
                    failures += 1
                    log.warning("start offset of %s: %s", queue, err)
                    continue
                pq.start_at(start)
                self._offsets.update(queue, start)
                log.info("%s starts at offset %d", queue, start)
            reason = pq.over_limit(self._flow)
            if reason is not None and not waiting_logged:
                log.info("pulls of %s wait: %s", queue, reason)
                waiting_logged = True
            await pq.wait_for_room(self._flow)
            waiting_logged = False
            if pq.dropped:
                return
            offset = pq.pulled_to
            assert offset is not None
            commit = self._offsets.read_local(queue) if self._config.clustering else None
            began = trio.current_time()
            try:
                raw = await self._requests.pull(
                    self._group,
                    queue,
                    offset,
                    max_nums=self._config.pull_batch_size,
                    expression=subscription.expression,
                    expression_type=subscription.expression_type,
                    sub_version=subscription.version,
                    suspend_ms=int(self._config.long_poll_s * 1000),
                    commit_offset=commit if commit is not None and commit > 0 else None,
                    timeout_s=self._config.long_poll_s + PULL_TIMEOUT_MARGIN_S,
                    prefer_id=prefer_id,
                )
            except MQClientError as err:
                failures += 1
                log.log(
                    logging.WARNING if failures == 1 else logging.DEBUG,
                    "pull of %s at %d failed (%d in a row): %s",
                    queue,
                    offset,
                    failures,
                    err,
                )
                continue
            if failures:
                log.info("pulls of %s go on at %s after %d failures", queue, raw.address, failures)
            failures = 0
            prefer_id = raw.suggest_which_broker_id
            if pq.dropped:
                return
            result = pull_result(raw, subscription)
            if result.status is PullStatus.OFFSET_ILLEGAL:
                log.warning(
                    "offset %d of %s is out of range [%d, %d]: continuing at %d",
                    offset,
                    queue,
                    result.min_offset,
                    result.max_offset,
                    result.next_begin_offset,
                )
                pq.move_to(result.next_begin_offset)
                moved = pq.commit_offset()  # still below any message held
                if moved is not None:
                    self._offsets.update(queue, moved, increase_only=False)
                continue
            added = pq.put(restore_topic(result.messages), result.next_begin_offset)
            committed = pq.commit_offset()
            if committed is not None:
                self._offsets.update(queue, committed)
            if added:
                await self._consumer.submit(pq, added)
                quick_empty = 0
            elif (
                result.status is PullStatus.NO_NEW_MSG
                and trio.current_time() - began < EMPTY_ANSWER_S_MIN
            ):
                quick_empty += 1
                if quick_empty > 1:  # not held: do not spin
                    await trio.sleep(EMPTY_ANSWER_S_MIN)
            else:
                quick_empty = 0
