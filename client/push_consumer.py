"""The push consumer: subscribe, register a listener, and messages arrive.

    consumer = AsyncPushConsumer("my_group", "127.0.0.1:9876")    # the trio API
    consumer.subscribe("Orders", "TagA || TagB")
    consumer.register_listener(handle)        # list[MessageExt] -> ConsumeStatus
    async with consumer:                      # start() ... shutdown()
        await trio.sleep_forever()

    with PushConsumer("my_group", "127.0.0.1:9876") as consumer:  # the blocking API
        ...   # subscribe and register before `with` (or start())

What runs (client/push_config.py has every setting):
- heartbeats to every replica of every broker of the subscribed topics (the group, the
  subscriptions, and in clustering mode %RETRY%<group> with "*"), every 30 s and at once when
  a route changes;
- rebalance at start, every 20 s and when a broker says the group changed
  (NOTIFY_CONSUMER_IDS_CHANGED): the group's members from a broker of the topic
  (GET_CONSUMER_LIST_BY_GROUP), ids and queues sorted, the allocation strategy picks this
  member's queues (broadcasting: every queue). A queue given up stops being pulled, its
  offset is committed (orderly: after the batch in progress, then its lock is released); a
  queue taken starts at the group's committed offset, or where `consume_from` says when there
  is none;
- one long-polling pull loop per owned queue (client/pull_loop.py), flow-controlled by its
  process queue; messages go to the consume service (client/consume_service.py);
- offsets committed every 5 s and on shutdown (client/offset_store.py); in orderly clustering
  mode the queues' broker locks renewed every 20 s (client/queue_locks.py).

Failover: every request goes to the group's master first and, on a transport failure or a
refusal, to the other replicas after an immediate route refresh (client/consumer_requests.py),
so pulls, commits and locks move to a new leader as soon as the old one stops answering. A
pull loop only advances to the nextBeginOffset of an answer it received, so nothing is skipped.

(Past 400 lines on purpose: what is here is one object's state, the owned queues with their
pull scopes and releases, changed only by rebalance and shutdown; the pieces that need none of
it live in the modules named above.)
"""

from __future__ import annotations

import logging
import math
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from types import TracebackType
from typing import Any, Self

import trio

from client.blocking import LoopThread
from client.consume_service import (
    ConcurrentConsumeService,
    ConsumeContext,
    OrderlyConsumeService,
)
from client.consumer_requests import ConsumerRequests
from client.errors import ClientClosed, MQClientError
from client.instance import ClientInstance, local_ip, open_instance
from client.message import MessageExt, MessageQueue
from client.offset_store import (
    LocalOffsetStore,
    OffsetStore,
    RemoteOffsetStore,
    offset_file_path,
)
from client.process_queue import FlowLimits, ProcessQueue, ProcessQueueInfo
from client.pull_loop import RETRY_PREFIX, PullLoop
from client.push_config import PushConfig
from client.queue_locks import QueueLocks
from client.rebalance import plan
from client.subscription import Subscription
from remoting.codes import RequestCode, ResponseCode
from remoting.command import RemotingCommand
from remoting.connection import Connection

log = logging.getLogger("client.push_consumer")

SHUTDOWN_NETWORK_S = 10.0  # on top of shutdown_wait_s: the last commits, unlocks, unregisters
PULL_LOOP_RESTART_S = 1.0  # a pull loop that failed unexpectedly starts again after this
RETRY_REBALANCE_S = 1.0  # sends back while no retry queue is pulled: one early rebalance per this


class AsyncPushConsumer:
    def __init__(
        self,
        group: str,
        namesrv: str | Sequence[str],
        *,
        model: str = "clustering",
        consume_from: Any = "last",
        instance_name: str | None = None,
        **settings: Any,
    ) -> None:
        """`settings`: any other field of PushConfig (allocate, pull_batch_size,
        consume_batch_size, workers, flow, suspend_s, offset_dir, ...)."""
        if not group:
            raise ValueError("a consumer needs a group name")
        self.group = group
        self.namesrv = namesrv
        self.instance_name = instance_name
        self.config = PushConfig(model=model, consume_from=consume_from, **settings)
        self._subscriptions: dict[str, Subscription] = {}
        self._listener: Callable[[list[MessageExt]], Any] | None = None
        self._orderly = False
        self._cm: AbstractAsyncContextManager[Self] | None = None
        self._started = False
        self._instance: ClientInstance | None = None
        self._queues: dict[MessageQueue, ProcessQueue] = {}
        self._closing = False  # from the start of shutdown: no queue is started any more

    # --- before start ----------------------------------------------------------------------

    def subscribe(self, topic: str, expression: str = "*", *, expression_type: str = "TAG") -> None:
        """Consume `topic`, messages whose tag is in `expression` ("*": all), or with
        `expression_type="SQL92"` those the SQL92 `expression` matches (RocketMQ's
        MessageSelector.bySql; the broker filters). Call before start."""
        self._not_started("subscribe")
        if topic.startswith(RETRY_PREFIX):
            raise ValueError(f"{topic!r} is a retry topic; the consumer subscribes it itself")
        self._subscriptions[topic] = Subscription.parse(topic, expression, expression_type)

    def register_listener(self, fn: Callable[[list[MessageExt]], Any]) -> None:
        """A concurrent listener: list[MessageExt] -> ConsumeStatus (plain or async def)."""
        self._not_started("register a listener")
        self._listener, self._orderly = fn, False

    def register_orderly_listener(self, fn: Callable[[list[MessageExt]], Any]) -> None:
        """An orderly listener: list[MessageExt] (one queue, in order) -> ConsumeOrderlyStatus."""
        self._not_started("register a listener")
        self._listener, self._orderly = fn, True

    def _not_started(self, what: str) -> None:
        if self._started:
            raise MQClientError(f"cannot {what} after the consumer started")

    # --- running ---------------------------------------------------------------------------

    @property
    def client_id(self) -> str:
        if self._instance is None:
            raise ClientClosed("the consumer is not running")
        return self._instance.client_id

    def assigned_queues(self) -> list[MessageQueue]:
        """The queues this member pulls now, sorted."""
        return sorted(self._queues)

    def consume_offsets(self) -> dict[MessageQueue, int | None]:
        """Per owned queue, the offset a commit would say now: the lowest not yet consumed
        (None while its start offset is being learnt)."""
        return {q: pq.commit_offset() for q, pq in sorted(self._queues.items())}

    def process_queues(self) -> dict[MessageQueue, ProcessQueueInfo]:
        """Per owned queue: what it holds, where it stands, whether pulls wait (monitoring)."""
        return {q: pq.info() for q, pq in sorted(self._queues.items())}

    async def __aenter__(self) -> Self:
        if self._started:
            raise MQClientError("a push consumer starts once; make a new one")
        if not self._subscriptions:
            raise MQClientError("subscribe to a topic before starting the consumer")
        if self._listener is None:
            raise MQClientError("register a listener before starting the consumer")
        self._started = True
        self._cm = self._running()
        return await self._cm.__aenter__()

    async def __aexit__(
        self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None
    ) -> None:
        cm, self._cm = self._cm, None
        if cm is not None:
            await cm.__aexit__(kind, err, tb)

    @asynccontextmanager
    async def _running(self) -> AsyncIterator[Self]:
        assert self._listener is not None
        config = self.config
        async with open_instance(self.namesrv, self.instance_name) as instance:
            self._instance = instance
            requests = ConsumerRequests(instance)
            offsets: OffsetStore
            if config.clustering:
                offsets = RemoteOffsetStore(requests, self.group)
            else:
                key = f"{local_ip()}@{self.instance_name or 'DEFAULT'}"
                offsets = LocalOffsetStore(
                    offset_file_path(config.offset_dir, key, self.group), self.group
                )
            ctx = ConsumeContext(self.group, config, requests, offsets, self._retry_queues_wanted)
            self._locks: QueueLocks | None = None
            if self._orderly and config.clustering:
                self._locks = QueueLocks(requests, self.group, instance.client_id)
            service: ConcurrentConsumeService | OrderlyConsumeService
            if self._orderly:
                locker = self._locks.ensure if self._locks is not None else None
                service = OrderlyConsumeService(ctx, self._listener, locker)
                flow = FlowLimits(config.flow.count_max, config.flow.bytes_max, None)
            else:
                service = ConcurrentConsumeService(ctx, self._listener)
                flow = config.flow
            self._requests, self._offsets = requests, offsets
            self._pulls = PullLoop(
                self.group,
                config,
                requests,
                offsets,
                service,
                flow,
                self._locks.ensure if self._locks is not None else None,
            )
            self._rebalance_wanted = trio.Event()
            self._retry_rebalanced_at = -math.inf
            self._rebalancing = trio.Lock()
            self._dropping: dict[MessageQueue, trio.Event] = {}
            self._pull_scopes: dict[MessageQueue, trio.CancelScope] = {}
            instance.serve(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, self._on_ids_changed)
            instance.heartbeat_parts.append(self._heartbeat_part)
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                await nursery.start(service.run)
                for topic in self._topics():
                    try:
                        await instance.route(topic)
                    except MQClientError as err:
                        # %RETRY%<group> exists only after the first send-back: not a problem
                        quiet = topic.startswith(RETRY_PREFIX)
                        log.log(
                            logging.DEBUG if quiet else logging.WARNING,
                            "%s (rebalance tries again)",
                            err,
                        )
                await instance.send_heartbeats()
                background = trio.CancelScope()
                nursery.start_soon(self._background, background)
                await self.rebalance()
                try:
                    yield self
                finally:
                    with trio.move_on_after(config.shutdown_wait_s + SHUTDOWN_NETWORK_S) as scope:
                        scope.shield = True
                        await self._shutdown(background)
                    nursery.cancel_scope.cancel()
            self._instance = None

    async def _shutdown(self, background: trio.CancelScope) -> None:
        """Stop pulling, let listeners finish (bounded), commit offsets, release locks, leave
        the group (so the others rebalance at once)."""
        # Cancelling the background does not stop a rebalance whose route or member list
        # already came back: it runs on to its next checkpoint, and would start the queues
        # stopped below again (pulled by a leaving member, an orderly queue's lock kept).
        self._closing = True
        background.cancel()
        if self._heartbeat_part in self._instance_or_closed().heartbeat_parts:
            self._instance_or_closed().heartbeat_parts.remove(self._heartbeat_part)
        for queue in list(self._queues):
            self._stop_queue(queue, bounded=True)
        for done in list(self._dropping.values()):
            await done.wait()
        await self._requests.unregister(self.group, self.client_id)
        log.info("consumer %s of %s shut down", self.client_id, self.group)

    def _instance_or_closed(self) -> ClientInstance:
        if self._instance is None:
            raise ClientClosed("the consumer is not running")
        return self._instance

    async def _background(self, scope: trio.CancelScope) -> None:
        with scope:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._rebalance_loop)
                nursery.start_soon(self._persist_loop)
                if self._locks is not None:
                    nursery.start_soon(self._lock_loop)

    # --- heartbeats and the group ----------------------------------------------------------

    def _topics(self) -> list[str]:
        topics = list(self._subscriptions)
        if self.config.clustering:
            topics.append(RETRY_PREFIX + self.group)
        return topics

    def subscription(self, topic: str) -> Subscription:
        sub = self._subscriptions.get(topic)
        if sub is None:  # the retry topic: everything sent back by this group
            sub = self._subscriptions[topic] = Subscription.parse(topic, "*")
        return sub

    def _heartbeat_part(self) -> dict[str, list[dict[str, Any]]]:
        return {
            "consumerDataSet": [
                {
                    "groupName": self.group,
                    "consumeType": "CONSUME_PASSIVELY",
                    "messageModel": self.config.model.upper(),
                    "consumeFromWhere": self.config.consume_from_name,
                    "subscriptionDataSet": [
                        self.subscription(t).heartbeat_data() for t in self._topics()
                    ],
                    "unitMode": False,
                }
            ]
        }

    async def _on_ids_changed(self, request: RemotingCommand, conn: Connection) -> RemotingCommand:
        log.debug("%s: the members of %s changed", conn.peer, self.group)
        self._rebalance_wanted.set()
        return request.response(ResponseCode.SUCCESS)

    def rebalance_now(self) -> None:
        """Rebalance at once instead of at the next tick."""
        self._rebalance_wanted.set()

    def _retry_queues_wanted(self) -> None:
        """A broker took messages back into %RETRY%<group>: while this member pulls none of
        that topic's queues (a new group's retry topic has no route when the consumer starts),
        rebalance now rather than at the next tick, 20 s away, at most once a RETRY_REBALANCE_S."""
        retry = RETRY_PREFIX + self.group
        if any(q.topic == retry for q in self._queues):
            return
        now = trio.current_time()
        if now - self._retry_rebalanced_at >= RETRY_REBALANCE_S:
            self._retry_rebalanced_at = now
            self.rebalance_now()

    # --- rebalance -------------------------------------------------------------------------

    async def _rebalance_loop(self) -> None:
        while True:
            with trio.move_on_after(self.config.rebalance_s):
                await self._rebalance_wanted.wait()
            self._rebalance_wanted = trio.Event()
            try:
                await self.rebalance()
            except Exception:  # an allocation function's bug, say: the next round tries again
                log.exception("rebalance of %s failed", self.group)

    async def rebalance(self) -> None:
        """Work out this member's queues of every subscribed topic, and start and stop pull
        loops to match. A topic whose route or members cannot be learnt now keeps its queues."""
        async with self._rebalancing:
            for topic in self._topics():
                try:
                    wanted = await self._allocate(topic)
                except MQClientError as err:
                    level = logging.DEBUG if topic.startswith(RETRY_PREFIX) else logging.WARNING
                    log.log(level, "rebalance of %s: %s", topic, err)
                    continue
                if self._closing:
                    return
                if wanted is None:
                    continue
                owned = [q for q in self._queues if q.topic == topic]
                change = plan(owned, wanted)
                for queue in sorted(change.stop):
                    self._stop_queue(queue, bounded=False)
                for queue in sorted(change.start):
                    self._start_queue(queue)
                if change.start or change.stop:
                    log.info(
                        "%s rebalanced %s: %d queues, +%s -%s",
                        self.client_id,
                        topic,
                        len(wanted),
                        sorted(q.queue_id for q in change.start),
                        sorted(q.queue_id for q in change.stop),
                    )

    async def _allocate(self, topic: str) -> list[MessageQueue] | None:
        route = await self._instance_or_closed().route(topic)
        queues = sorted(route.read_queues())
        if not self.config.clustering:
            return queues
        ids = await self._requests.consumer_ids(self.group, topic)
        if ids is None or self.client_id not in ids:
            log.info(
                "%s is not yet among the members of %s: heartbeat first", self.client_id, self.group
            )
            self._instance_or_closed().heartbeat_now()
            return None
        return self.config.allocate(self.group, self.client_id, queues, ids)

    def _start_queue(self, queue: MessageQueue) -> None:
        assert not self._closing, queue
        pq = ProcessQueue(queue)
        scope = trio.CancelScope()
        self._queues[queue] = pq
        self._pull_scopes[queue] = scope
        self._nursery.start_soon(self._run_queue, pq, scope)

    async def _run_queue(self, pq: ProcessQueue, scope: trio.CancelScope) -> None:
        previous = self._dropping.get(pq.queue)
        if previous is not None:  # given up and taken back: the old one finishes first
            await previous.wait()
        with scope:
            while not pq.dropped:
                try:
                    await self._pulls.run(pq, self.subscription(pq.queue.topic))
                except Exception:  # a bug: say so loudly, keep the other queues going
                    log.exception("the pull loop of %s failed; it starts again", pq.queue)
                    await trio.sleep(PULL_LOOP_RESTART_S)

    def _stop_queue(self, queue: MessageQueue, *, bounded: bool) -> None:
        pq = self._queues.pop(queue)
        pq.drop()
        self._pull_scopes.pop(queue).cancel()
        done = trio.Event()
        self._dropping[queue] = done
        self._nursery.start_soon(self._release, pq, done, bounded)

    async def _release(self, pq: ProcessQueue, done: trio.Event, bounded: bool) -> None:
        """After a queue is given up: wait for its listener (orderly: always, the lock keeps
        others out meanwhile; otherwise at most shutdown_wait_s), commit its offset, then
        release its lock."""
        queue = pq.queue
        try:
            with trio.move_on_after(
                self.config.shutdown_wait_s if bounded or self._locks is None else float("inf")
            ):
                await pq.wait_idle()
            offset = pq.commit_offset()
            pq.released = True
            if offset is not None:
                self._offsets.update(queue, offset)
            await self._offsets.persist([queue])
            self._offsets.forget(queue)
            if self._locks is not None and not pq.consuming:
                await self._locks.release(queue)
        finally:
            done.set()
            if self._dropping.get(queue) is done:
                del self._dropping[queue]

    # --- offsets and locks -----------------------------------------------------------------

    async def _persist_loop(self) -> None:
        while True:
            await trio.sleep(self.config.persist_s)
            await self._offsets.persist(list(self._queues))

    async def _lock_loop(self) -> None:
        assert self._locks is not None
        while True:
            await trio.sleep(self.config.lock_renew_s)
            await self._locks.renew_all(self._queues)


class PushConsumer:
    """The blocking API: subscribe and register, then `start()`/`shutdown()` or `with`. A
    plain-function listener runs in one of `workers` threads."""

    def __init__(
        self,
        group: str,
        namesrv: str | Sequence[str],
        *,
        model: str = "clustering",
        consume_from: Any = "last",
        instance_name: str | None = None,
        **settings: Any,
    ) -> None:
        self._consumer = AsyncPushConsumer(
            group,
            namesrv,
            model=model,
            consume_from=consume_from,
            instance_name=instance_name,
            **settings,
        )
        self._loop: LoopThread[AsyncPushConsumer] | None = None

    @property
    def group(self) -> str:
        return self._consumer.group

    def subscribe(self, topic: str, expression: str = "*", *, expression_type: str = "TAG") -> None:
        self._consumer.subscribe(topic, expression, expression_type=expression_type)

    def register_listener(self, fn: Callable[[list[MessageExt]], Any]) -> None:
        self._consumer.register_listener(fn)

    def register_orderly_listener(self, fn: Callable[[list[MessageExt]], Any]) -> None:
        self._consumer.register_orderly_listener(fn)

    def start(self) -> None:
        if self._loop is None:
            consumer = self._consumer
            self._loop = LoopThread(lambda: consumer, name="mq-push-consumer")

    def shutdown(self) -> None:
        loop, self._loop = self._loop, None
        if loop is not None:
            loop.close()

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    @property
    def client_id(self) -> str:
        return self._call(lambda: self._consumer.client_id)

    def assigned_queues(self) -> list[MessageQueue]:
        return self._call(self._consumer.assigned_queues)

    def consume_offsets(self) -> dict[MessageQueue, int | None]:
        return self._call(self._consumer.consume_offsets)

    def process_queues(self) -> dict[MessageQueue, ProcessQueueInfo]:
        return self._call(self._consumer.process_queues)

    def _call(self, fn: Callable[[], Any]) -> Any:
        if self._loop is None:
            raise ClientClosed("the consumer is not started: call start() or use `with`")
        return self._loop.call_sync(fn)
