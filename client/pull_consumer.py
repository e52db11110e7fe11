"""The pull consumer: the application picks queues and offsets and pulls itself.

    async with AsyncPullConsumer("my_group", "127.0.0.1:9876") as consumer:
        for queue in await consumer.fetch_queues("Orders"):
            offset = await consumer.fetch_offset(queue) or 0
            result = await consumer.pull(queue, offset, max_nums=32)
            for message in result.messages: ...
            await consumer.commit_offset(queue, result.next_begin_offset)

    with PullConsumer("my_group", "127.0.0.1:9876") as consumer:   # the blocking API
        result = consumer.pull(queue, 0)

A pull goes to the queue's broker group: the replica the broker last suggested
(suggestWhichBrokerId), else the master, and on a transport failure or a refusal the route is
refreshed and the other replicas are tried (every replica of our broker serves pulls from its
applied state). The broker filters by tag hash; `pull` filters again by tag string, as
RocketMQ clients do, so hash collisions never reach the application. Offsets are the group's,
stored on the brokers (commit_offset / fetch_offset); the pull consumer sends no heartbeat.
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AsyncExitStack
from types import TracebackType
from typing import Any, Self, TypeVar

import attrs

from client.blocking import LoopThread
from client.consumer_requests import ConsumerRequests, RawPull
from client.errors import ClientClosed, NoRouteError
from client.instance import ClientInstance, open_instance
from client.message import MessageExt, MessageQueue
from client.subscription import Subscription
from remoting.codes import RequestCode, ResponseCode

PULL_TIMEOUT_S = 10.0  # a pull's answer, on top of any time the broker may hold it
PULL_MESSAGES_MAX = 32  # what a broker returns at most (maxTransferCountOnMessageInMemory)

R = TypeVar("R")


class PullStatus(enum.Enum):
    FOUND = "FOUND"  # messages (after the client's tag filter: at least one)
    NO_NEW_MSG = "NO_NEW_MSG"  # the offset is the queue's end
    NO_MATCHED_MSG = "NO_MATCHED_MSG"  # messages were scanned but none matched the expression
    OFFSET_ILLEGAL = "OFFSET_ILLEGAL"  # out of range: continue from next_begin_offset


@attrs.frozen
class PullResult:
    status: PullStatus
    next_begin_offset: int  # where the next pull of this queue starts
    min_offset: int  # the queue's first offset kept
    max_offset: int  # the queue's next offset (one past its last message)
    messages: list[MessageExt]


def pull_result(raw: RawPull, subscription: Subscription) -> PullResult:
    """A broker's answer as the application sees it: the tag filter applied again."""
    messages = [m for m in raw.messages if subscription.matches(m.tags)]
    if raw.code == ResponseCode.SUCCESS:
        status = PullStatus.FOUND if messages else PullStatus.NO_MATCHED_MSG
    elif raw.code == ResponseCode.PULL_NOT_FOUND:
        status = PullStatus.NO_NEW_MSG
    elif raw.code == ResponseCode.PULL_RETRY_IMMEDIATELY:
        status = PullStatus.NO_MATCHED_MSG
    else:
        assert raw.code == ResponseCode.PULL_OFFSET_MOVED, raw.code
        status = PullStatus.OFFSET_ILLEGAL
    return PullResult(status, raw.next_begin_offset, raw.min_offset, raw.max_offset, messages)


class AsyncPullConsumer:
    """The trio API; use it as `async with AsyncPullConsumer(group, namesrv) as consumer`."""

    def __init__(
        self, group: str, namesrv: str | Sequence[str], *, instance_name: str | None = None
    ) -> None:
        if not group:
            raise ValueError("a consumer needs a group name")
        self.group = group
        self.namesrv = namesrv
        self.instance_name = instance_name
        self._stack: AsyncExitStack | None = None
        self._instance: ClientInstance | None = None
        self._requests: ConsumerRequests | None = None
        self._suggested: dict[MessageQueue, int] = {}  # suggestWhichBrokerId per queue

    async def __aenter__(self) -> Self:
        stack = AsyncExitStack()
        self._instance = await stack.enter_async_context(
            open_instance(self.namesrv, self.instance_name)
        )
        self._requests = ConsumerRequests(self._instance)
        self._stack = stack
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None
    ) -> None:
        stack, self._stack, self._requests = self._stack, None, None
        if stack is not None:
            await stack.__aexit__(kind, err, tb)

    @property
    def requests(self) -> ConsumerRequests:
        if self._requests is None:
            raise ClientClosed("the pull consumer is not open: use it in an `async with` block")
        return self._requests

    async def fetch_queues(self, topic: str) -> list[MessageQueue]:
        """The topic's readable queues, by broker name then queue id (a fresh route)."""
        route = await self.requests.instance.refresh(topic, force=True)
        if route is None:
            raise NoRouteError(topic, "no namesrv knows it (create it with mqadmin updateTopic)")
        return route.read_queues()

    async def pull(
        self,
        queue: MessageQueue,
        offset: int,
        max_nums: int = PULL_MESSAGES_MAX,
        timeout: float = PULL_TIMEOUT_S,
        expression: str = "*",
        *,
        block_s: float = 0.0,
        expression_type: str = "TAG",
    ) -> PullResult:
        """Up to `max_nums` messages from `offset`, those `expression` matches (TAG, or with
        `expression_type="SQL92"` an SQL92 one). With `block_s` > 0 the broker holds a pull
        that finds nothing new for up to that long (long polling) before NO_NEW_MSG."""
        if offset < 0:
            raise ValueError(f"offset must not be negative: {offset}")
        if not 1 <= max_nums <= PULL_MESSAGES_MAX:
            raise ValueError(f"max_nums must be 1..{PULL_MESSAGES_MAX}, not {max_nums}")
        subscription = Subscription.parse(queue.topic, expression, expression_type)
        raw = await self.requests.pull(
            self.group,
            queue,
            offset,
            max_nums=max_nums,
            expression=subscription.expression,
            expression_type=subscription.expression_type,
            sub_version=0,
            suspend_ms=int(block_s * 1000),
            commit_offset=None,
            timeout_s=timeout + max(0.0, block_s),
            prefer_id=self._suggested.get(queue),
        )
        self._suggested[queue] = raw.suggest_which_broker_id
        return pull_result(raw, subscription)

    async def commit_offset(self, queue: MessageQueue, offset: int) -> None:
        """Store the group's offset of `queue`: the next offset to consume."""
        await self.requests.update_offset(self.group, queue, offset)

    async def fetch_offset(self, queue: MessageQueue) -> int | None:
        """The group's stored offset of `queue`, None when the broker has none. (A broker
        answers 0 for a queue nothing has been deleted from yet, as RocketMQ's does.)"""
        return await self.requests.query_offset(self.group, queue)

    async def min_offset(self, queue: MessageQueue) -> int:
        return await self.requests.queue_offset(RequestCode.GET_MIN_OFFSET, queue)

    async def max_offset(self, queue: MessageQueue) -> int:
        """One past the queue's last message."""
        return await self.requests.queue_offset(RequestCode.GET_MAX_OFFSET, queue)

    async def search_offset(self, queue: MessageQueue, timestamp_ms: int) -> int:
        """The first offset whose message was stored at or after `timestamp_ms` (the queue's
        end when none was)."""
        return await self.requests.search_offset(queue, timestamp_ms)

    async def earliest_store_time(self, queue: MessageQueue) -> int:
        return await self.requests.earliest_store_time(queue)


class PullConsumer:
    """The blocking API: the same methods, run on a trio loop of the consumer's own."""

    def __init__(
        self, group: str, namesrv: str | Sequence[str], *, instance_name: str | None = None
    ) -> None:
        self._make = functools.partial(
            AsyncPullConsumer, group, namesrv, instance_name=instance_name
        )
        self._make()  # checks the arguments now
        self._loop: LoopThread[AsyncPullConsumer] | None = None

    def start(self) -> None:
        if self._loop is None:
            self._loop = LoopThread(self._make, name="mq-pull-consumer")

    def shutdown(self) -> None:
        loop, self._loop = self._loop, None
        if loop is not None:
            loop.close()

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def _run(self, fn: Callable[..., Awaitable[R]], *args: Any, **kwargs: Any) -> R:
        if self._loop is None:
            raise ClientClosed("the pull consumer is not started: call start() or use `with`")
        return self._loop.call(functools.partial(fn, *args, **kwargs))

    @property
    def _consumer(self) -> AsyncPullConsumer:
        if self._loop is None:
            raise ClientClosed("the pull consumer is not started: call start() or use `with`")
        return self._loop.value

    def fetch_queues(self, topic: str) -> list[MessageQueue]:
        return self._run(self._consumer.fetch_queues, topic)

    def pull(
        self,
        queue: MessageQueue,
        offset: int,
        max_nums: int = PULL_MESSAGES_MAX,
        timeout: float = PULL_TIMEOUT_S,
        expression: str = "*",
        *,
        block_s: float = 0.0,
        expression_type: str = "TAG",
    ) -> PullResult:
        return self._run(
            self._consumer.pull,
            queue,
            offset,
            max_nums,
            timeout,
            expression,
            block_s=block_s,
            expression_type=expression_type,
        )

    def commit_offset(self, queue: MessageQueue, offset: int) -> None:
        self._run(self._consumer.commit_offset, queue, offset)

    def fetch_offset(self, queue: MessageQueue) -> int | None:
        return self._run(self._consumer.fetch_offset, queue)

    def min_offset(self, queue: MessageQueue) -> int:
        return self._run(self._consumer.min_offset, queue)

    def max_offset(self, queue: MessageQueue) -> int:
        return self._run(self._consumer.max_offset, queue)

    def search_offset(self, queue: MessageQueue, timestamp_ms: int) -> int:
        return self._run(self._consumer.search_offset, queue, timestamp_ms)

    def earliest_store_time(self, queue: MessageQueue) -> int:
        return self._run(self._consumer.earliest_store_time, queue)
