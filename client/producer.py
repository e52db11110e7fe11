"""The producer: `AsyncProducer` for trio code, `Producer` (client/blocking_producer.py) for
everything else, one implementation.

    async with AsyncProducer("pg", "127.0.0.1:9876") as producer:
        result = await producer.send(Message("Orders", b"hello", tags="TagA", keys="order-1"))

A send goes to a write queue picked in turn among the topic's broker groups, skipping groups
the fault tracker avoids (client/fault.py). An attempt on a group tries its replicas, master
first unless it just failed, each request waiting at most the send's RequestBudget (half a
second to begin with; client/attempts.py); when it fails, the route is refreshed from the
namesrvs at once (in the background) and the next attempt goes to another group when there is
one, up to 1 + retry_times attempts within the send timeout. The route is refreshed too when a
replica failed before another stored the message, or when the answer came from a replica that
forwarded the write to its leader (the route names an old master). An ordered send
(`selector=`) never leaves its queue: it tries the queue's group again, through any replica,
until the group has a leader again or the timeout ends. A topic no namesrv knows is sent with TBW102's route, so the broker
creates it (the RocketMQ way); its own route is asked for again after the first send.

What a send ends with: a SendResult (SEND_OK, or a "stored, not durable enough" status, never
retried); SendOutcomeUnknown when an attempt went out without an answer and none succeeded
(the message may be stored: dedupe by its UNIQ_KEY); MQBrokerError when brokers refused it;
BrokerUnreachable when none could be reached; InvalidMessage before anything is sent.

The send path's pieces live apart: the wire (send_request.py), one attempt on one group
(attempts.py), the queues of a topic (write_queues.py), the picker and the tracker
(selectors.py, fault.py). This module keeps the retry loops and the producer's life in one
place, which is why it is a little over 400 lines.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import trio

from client import limits
from client.attempts import REQUEST_S_MIN, GroupFailure, RequestBudget, attempt, send_error
from client.auto_batch import AutoBatcher
from client.errors import (
    BrokerUnreachable,
    ClientClosed,
    InvalidMessage,
    MQClientError,
    NoRouteError,
)
from client.fault import FaultTracker
from client.instance import TRANSPORT_FAILURES, ClientInstance, open_instance, parse_namesrv
from client.message import Message, MessageQueue
from client.selectors import RoundRobin, Selector
from client.send_request import Outgoing, prepare, prepare_batches, request
from client.send_result import SendResult
from client.validation import check_group, check_message, check_messages
from client.write_queues import TopicWriteQueues, WriteQueues
from remoting.codes import RequestCode, ResponseCode
from remoting.command import RemotingCommand
from remoting.errors import ConnectionClosed
from remoting.headers import UnregisterClientRequestHeader

log = logging.getLogger("client.producer")

DEFAULT_NAMESRV = "127.0.0.1:9876;127.0.0.1:9877"

# What send_async hands its callback: the result, or the exception the send raised.
SendCallback = Callable[[SendResult | BaseException], object]


class _InFlight:
    """The async sends in flight, bounded in number and in body bytes; `acquire` waits."""

    def __init__(self, count_max: int, bytes_max: int) -> None:
        self._count_max = count_max
        self._bytes_max = bytes_max
        self.count = 0
        self.bytes = 0
        self._room = trio.Event()
        self._waiting = 0  # acquirers waiting for room: a release wakes them only if any

    async def acquire(self, size: int) -> None:
        while self.count >= self._count_max or (self.count and self.bytes + size > self._bytes_max):
            self._waiting += 1
            try:
                await self._room.wait()
            finally:
                self._waiting -= 1
        self.count += 1
        self.bytes += size

    def release(self, size: int) -> None:
        self.count -= 1
        self.bytes -= size
        if self._waiting:  # (a new Event per release, when no one waits, cost 0.5 us a send)
            self._room.set()
            self._room = trio.Event()


class AsyncProducer:
    """A producer for trio code; use it as `async with AsyncProducer(group, namesrv) as p:`.

    `namesrv` is "host:port;host:port" or a list; every namesrv is asked in turn. `send_timeout`
    (seconds) bounds each send, every retry included; `retry_times` is how many more attempts
    a send may make after the first (RocketMQ's retryTimesWhenSendFailed). With `auto_batch`,
    concurrent sends without a selector share batch requests (client/auto_batch.py); each
    message is still acknowledged on its own.
    """

    def __init__(
        self,
        group: str,
        namesrv: str | Sequence[str] = DEFAULT_NAMESRV,
        *,
        retry_times: int = limits.RETRY_TIMES_DEFAULT,
        send_timeout: float = limits.SEND_TIMEOUT_S_DEFAULT,
        instance_name: str | None = None,
        auto_batch: bool = False,
    ) -> None:
        check_group(group)
        if not 0 <= retry_times <= limits.RETRY_TIMES_MAX:
            raise InvalidMessage("retry_times", f"{retry_times}, not 0..{limits.RETRY_TIMES_MAX}")
        if not send_timeout > 0:
            raise InvalidMessage("send_timeout", f"{send_timeout}, not a positive number of s")
        try:
            parse_namesrv(namesrv)
        except ValueError as err:
            raise InvalidMessage("namesrv", f"{namesrv!r}: {err}") from err
        self.group = group
        self.namesrv = namesrv
        self.retry_times = retry_times
        self.send_timeout = send_timeout
        self.instance_name = instance_name
        self.auto_batch = auto_batch
        self._batcher: AutoBatcher | None = None
        self.tracker = FaultTracker()
        self._round_robin = RoundRobin()
        self._write_queues = TopicWriteQueues(self._live)
        self._refresh_pending: set[str] = set()
        self._stale_refreshed: dict[str, float] = {}  # topic -> when a forwarded answer refreshed
        self._created: set[str] = set()  # topics a send of ours had the broker auto-create
        self._in_flight = _InFlight(limits.ASYNC_SENDS_MAX, limits.ASYNC_SEND_BYTES_MAX)
        self._instance: ClientInstance | None = None
        self._background: trio.Nursery | None = None
        self._async_sends: trio.Nursery | None = None
        self._context: AbstractAsyncContextManager[None] | None = None
        self._closing = False  # set on leaving the block: new sends are refused
        self._closed = False  # set once the sends in flight have ended

    # --- life ------------------------------------------------------------------------------

    async def __aenter__(self) -> AsyncProducer:
        if self._context is not None or self._closed:
            raise ClientClosed("a producer is started once; make a new one")
        self._context = self._running()
        await self._context.__aenter__()
        return self

    async def __aexit__(self, *exc: Any) -> bool | None:
        assert self._context is not None
        self._closing = True  # no new sends; those in flight finish
        return await self._context.__aexit__(*exc)

    @asynccontextmanager
    async def _running(self) -> AsyncIterator[None]:
        async with open_instance(self.namesrv, self.instance_name) as instance:
            instance.heartbeat_parts.append(self._heartbeat_part)
            try:
                async with trio.open_nursery() as background:
                    self._instance, self._background = instance, background
                    async with trio.open_nursery() as async_sends:
                        self._async_sends = async_sends
                        if self.auto_batch:
                            self._batcher = AutoBatcher(
                                async_sends, instance.uniq_ids, self._send_batched
                            )
                        yield
                    # every async send has ended (each within its timeout)
                    self._closed = True
                    await self._unregister(instance)
                    background.cancel_scope.cancel()
            finally:
                self._closed = True
                instance.heartbeat_parts.remove(self._heartbeat_part)

    def _heartbeat_part(self) -> dict[str, list[dict[str, Any]]]:
        return {"producerDataSet": [{"groupName": self.group}]}

    async def _unregister(self, instance: ClientInstance) -> None:
        """UNREGISTER_CLIENT to every broker we are connected to, so a Java broker forgets us
        now rather than 120 s after the last heartbeat; failures are only logged."""
        fields = UnregisterClientRequestHeader(
            client_id=instance.client_id, producer_group=self.group
        ).encode()

        async def one(address: str) -> None:
            command = RemotingCommand.request(RequestCode.UNREGISTER_CLIENT, fields)
            try:
                response = await instance.request(address, command, limits.UNREGISTER_TIMEOUT_S)
            except TRANSPORT_FAILURES as err:
                log.debug("unregistering from %s failed: %s", address, err)
                return
            if response.code != ResponseCode.SUCCESS:
                log.debug("unregistering from %s refused: %s", address, response.remark)

        namesrvs = set(instance.namesrv)
        with trio.move_on_after(limits.UNREGISTER_TIMEOUT_S):
            async with trio.open_nursery() as nursery:
                for address in instance.pool.addresses():
                    if address not in namesrvs:
                        nursery.start_soon(one, address)

    def _accepting(self) -> ClientInstance:
        """The instance, for a new send; ClientClosed outside the producer's block."""
        if self._closing:
            raise ClientClosed("the producer is closed")
        return self._live()

    def _live(self) -> ClientInstance:
        if self._closed or self._instance is None:
            raise ClientClosed(
                "the producer is not running: use it inside `async with AsyncProducer(...)`"
            )
        return self._instance

    # --- sending ---------------------------------------------------------------------------

    async def send(
        self,
        message: Message,
        timeout: float | None = None,
        *,
        selector: Selector | None = None,
        arg: Any = None,
    ) -> SendResult:
        """Send one message and wait until it is stored; see the module docstring for what it
        raises. With `selector` (e.g. hash_selector) and `arg` (the sharding key) the message
        goes to the queue the selector picks, and only there: an ordered send."""
        instance = self._accepting()
        check_message(message)
        deadline = trio.current_time() + self._timeout(timeout)
        if self._batcher is not None and selector is None and not message.delay_level:
            return await self._batcher.send(message, deadline)
        outgoing = prepare(message, instance.uniq_ids)
        return await self._send(outgoing, message, selector, arg, deadline)

    async def _send_batched(self, outgoing: Outgoing, deadline: float) -> SendResult:
        return await self._send(outgoing, None, None, None, deadline)

    async def send_batch(
        self, messages: Sequence[Message], timeout: float | None = None
    ) -> list[SendResult]:
        """Send messages of one topic as few SEND_BATCH_MESSAGE requests as the splitter
        allows (4 MiB, 1024 messages each); one SendResult per batch, in order. Each batch is
        one send with its own timeout and retries. If one fails, the batches before it are
        stored: the exception's notes say how many."""
        instance = self._accepting()
        check_messages(messages)
        batches = prepare_batches(list(messages), instance.uniq_ids)
        results: list[SendResult] = []
        for outgoing in batches:
            deadline = trio.current_time() + self._timeout(timeout)
            try:
                results.append(await self._send(outgoing, None, None, None, deadline))
            except MQClientError as err:
                err.add_note(
                    f"{len(results)} of {len(batches)} batches were stored before this one: "
                    + ", ".join(r.msg_id for r in results)
                )
                raise
        return results

    async def send_oneway(self, message: Message) -> None:
        """Send one message without waiting for the broker (it does not answer): returns once
        the request is handed to a connection; raises only when no replica of the picked
        group can be connected to. Nothing says whether it was stored."""
        instance = self._accepting()
        check_message(message)
        outgoing = prepare(message, instance.uniq_ids)
        deadline = trio.current_time() + self.send_timeout
        found = await self._write_queues.find(outgoing.topic, deadline)
        queue = self._round_robin.pick(found.queues, self.tracker, ())
        causes: list[str] = []
        for address in self.tracker.replica_order(instance.broker_addresses(queue.broker_name)):
            cause = await self._write_oneway(instance, address, outgoing, queue, deadline)
            if cause is None:
                return
            causes.append(cause)
        self.tracker.failed(queue.broker_name)
        self._refresh_soon(found.route.topic)
        raise BrokerUnreachable(f"one-way send to {queue}", causes or ["no address known"])

    async def _write_oneway(
        self,
        instance: ClientInstance,
        address: str,
        outgoing: Outgoing,
        queue: MessageQueue,
        deadline: float,
    ) -> str | None:
        """None once written to the connection to `address`, else why not."""
        left_s = deadline - trio.current_time()
        try:
            with trio.fail_after(max(0.0, left_s)):
                conn = await instance.pool.get(address)
                await conn.send_oneway(request(self.group, outgoing, queue.queue_id, oneway=True))
        except (OSError, trio.TooSlowError, ValueError, ConnectionClosed) as err:
            return f"{address}: {err or type(err).__name__}"
        return None

    async def send_async(
        self,
        message: Message,
        callback: SendCallback,
        timeout: float | None = None,
        *,
        selector: Selector | None = None,
        arg: Any = None,
    ) -> None:
        """Start a send in the producer's nursery and return; `callback(result or exception)`
        is called when it ends, in this trio run. Waits first while ASYNC_SENDS_MAX sends
        (or ASYNC_SEND_BYTES_MAX of bodies) are in flight. Raises at once what is wrong with
        the message (InvalidMessage) or a closed producer; everything else reaches the
        callback. Leaving the producer's block waits for the sends in flight."""
        instance = self._accepting()
        check_message(message)
        batcher = self._batcher
        if batcher is not None and selector is None and not message.delay_level:
            size = len(message.body)
            await self._in_flight.acquire(size)
            if self._closing:
                self._in_flight.release(size)
                raise ClientClosed("the producer closed while this send waited for room")

            def done(outcome: SendResult | Exception) -> None:
                self._in_flight.release(size)
                _call_back(callback, outcome)

            batcher.add(message, trio.current_time() + self._timeout(timeout), done)
            return
        outgoing = prepare(message, instance.uniq_ids)
        size = outgoing.body_bytes
        await self._in_flight.acquire(size)
        nursery = self._async_sends
        if self._closing or nursery is None:
            self._in_flight.release(size)
            raise ClientClosed("the producer closed while this send waited for room")
        deadline = trio.current_time() + self._timeout(timeout)
        nursery.start_soon(
            self._send_and_call_back, outgoing, message, selector, arg, deadline, callback, size
        )

    async def _send_and_call_back(
        self,
        outgoing: Outgoing,
        message: Message,
        selector: Selector | None,
        arg: Any,
        deadline: float,
        callback: SendCallback,
        size: int,
    ) -> None:
        outcome: SendResult | BaseException
        try:
            outcome = await self._send(outgoing, message, selector, arg, deadline)
        except trio.Cancelled:
            _call_back(callback, ClientClosed("the producer closed before the send ended"))
            raise
        except Exception as err:  # MQClientError, or a bug: the callback hears of both
            if not isinstance(err, MQClientError):
                log.exception("send_async of %s failed", outgoing.uniq_key)
            outcome = err
        finally:
            self._in_flight.release(size)
        _call_back(callback, outcome)

    @property
    def async_sends_in_flight(self) -> int:
        return self._in_flight.count

    def _timeout(self, timeout: float | None) -> float:
        timeout_s = self.send_timeout if timeout is None else timeout
        if not timeout_s > 0:
            raise InvalidMessage("timeout", f"{timeout_s}, not a positive number of seconds")
        return timeout_s

    async def _send(
        self,
        outgoing: Outgoing,
        message: Message | None,
        selector: Selector | None,
        arg: Any,
        deadline: float,
    ) -> SendResult:
        found = await self._write_queues.find(outgoing.topic, deadline)
        if selector is None:
            result = await self._send_any_queue(outgoing, found, deadline)
        else:
            assert message is not None
            queues = self._write_queues.ordered_queues(outgoing.topic, found)
            queue = selector(list(queues), message, arg)
            if queue not in queues:
                raise InvalidMessage(
                    "selector",
                    f"it returned {queue!r}, not one of the {len(queues)} write queues "
                    f"of {outgoing.topic!r}",
                )
            result = await self._send_one_queue(outgoing, queue, found, deadline)
        if found.via_default and outgoing.topic not in self._created:
            self._created.add(outgoing.topic)  # the broker created it: its own route follows
            if self._background is not None and not self._closed:
                self._background.start_soon(self._await_created_route, outgoing.topic)
        return result

    async def _send_any_queue(
        self, outgoing: Outgoing, found: WriteQueues, deadline: float
    ) -> SendResult:
        """Up to 1 + retry_times attempts, each on a group not tried yet while there is one."""
        tried: list[str] = []
        failures: list[GroupFailure] = []
        backoff_s = limits.SAME_GROUP_BACKOFF_S_MIN
        budget = RequestBudget.for_send(outgoing)
        for _ in range(1 + self.retry_times):
            if tried:  # the route may have changed; without an answer, keep the last one
                with contextlib.suppress(NoRouteError):
                    found = await self._write_queues.find(outgoing.topic, deadline)
            queue = self._round_robin.pick(found.queues, self.tracker, tried)
            if queue.broker_name in tried:  # no other group: give this one a moment
                await self._wait_route_change(found.route.topic, backoff_s, deadline)
                backoff_s = min(2 * backoff_s, limits.SAME_GROUP_BACKOFF_S_MAX)
            if deadline - trio.current_time() < REQUEST_S_MIN:
                break
            tried.append(queue.broker_name)
            try:
                return await self._attempt(outgoing, queue, found, deadline, budget)
            except GroupFailure as failure:
                failures.append(failure)
                if failure.final:
                    break
        raise send_error(f"send to topic {outgoing.topic!r}", outgoing, failures)

    async def _send_one_queue(
        self, outgoing: Outgoing, queue: MessageQueue, found: WriteQueues, deadline: float
    ) -> SendResult:
        """An ordered send: this queue only, again and again until the send timeout."""
        failures: list[GroupFailure] = []
        backoff_s = limits.SAME_GROUP_BACKOFF_S_MIN
        budget = RequestBudget.for_send(outgoing)
        while deadline - trio.current_time() >= REQUEST_S_MIN:
            try:
                return await self._attempt(outgoing, queue, found, deadline, budget)
            except GroupFailure as failure:
                failures.append(failure)
                if failure.final:
                    break
            await self._wait_route_change(found.route.topic, backoff_s, deadline)
            backoff_s = min(2 * backoff_s, limits.SAME_GROUP_BACKOFF_S_MAX)
        raise send_error(f"ordered send to {queue}", outgoing, failures)

    async def _attempt(
        self,
        outgoing: Outgoing,
        queue: MessageQueue,
        found: WriteQueues,
        deadline: float,
        budget: RequestBudget,
    ) -> SendResult:
        instance = self._live()
        topic = found.route.topic
        try:
            stored = await attempt(
                instance, self.group, outgoing, queue, deadline, budget, self.tracker
            )
        except GroupFailure as failure:
            log.info("send %s: %s", outgoing.uniq_key, failure)
            self.tracker.failed(queue.broker_name)
            self._refresh_soon(topic)
            raise
        self.tracker.answered(queue.broker_name, stored.latency_s)
        if stored.passed_over:  # a replica failed before another stored it
            log.info(
                "send %s: stored through %s after %s",
                outgoing.uniq_key,
                stored.address,
                "; ".join(map(str, stored.passed_over)),
            )
            self._refresh_soon(topic)
        elif stored.forwarded:
            self._refresh_stale(topic)
        return stored.result

    async def _wait_route_change(self, topic: str, wait_s: float, deadline: float) -> None:
        with trio.move_on_at(min(deadline, trio.current_time() + wait_s)):
            await self._live().wait_route_change(topic)

    # --- routes ----------------------------------------------------------------------------

    def _refresh_soon(self, topic: str) -> None:
        """Ask the namesrvs for `topic`'s route now, in the background; one at a time."""
        if topic in self._refresh_pending or self._background is None or self._closed:
            return
        self._refresh_pending.add(topic)
        self._background.start_soon(self._refresh, topic)

    def _refresh_stale(self, topic: str) -> None:
        """A replica that is not the leader answered (it forwarded the write): the route names
        an old master. Ask for it again, at most every FORWARDED_REFRESH_S per topic (while the
        client is cut off from the leader alone, every answer is forwarded)."""
        now = trio.current_time()
        if now - self._stale_refreshed.get(topic, -1e9) < limits.FORWARDED_REFRESH_S:
            return
        self._stale_refreshed[topic] = now
        self._refresh_soon(topic)

    async def _await_created_route(self, topic: str) -> None:
        """Ask until the namesrvs route a topic our send had a broker create: the broker
        registers it after answering the send, so the first answers may still say it does not
        exist. Doubling pauses, for at most CREATED_ROUTE_WAIT_S."""
        pause_s = limits.SAME_GROUP_BACKOFF_S_MIN
        with trio.move_on_after(limits.CREATED_ROUTE_WAIT_S):
            while not self._closed:
                try:
                    if await self._live().refresh(topic, force=True) is not None:
                        return
                except (NoRouteError, ClientClosed) as err:
                    log.info("refreshing the route of %s: %s", topic, err)
                await trio.sleep(pause_s)
                pause_s = min(2 * pause_s, limits.SAME_GROUP_BACKOFF_S_MAX)
        log.info("no namesrv routes %s yet; its sends use TBW102's route meanwhile", topic)

    async def _refresh(self, topic: str) -> None:
        try:
            await self._live().refresh(topic, force=True)
        except (NoRouteError, ClientClosed) as err:
            log.info("refreshing the route of %s: %s", topic, err)
        finally:
            self._refresh_pending.discard(topic)


def _call_back(callback: SendCallback, outcome: SendResult | BaseException) -> None:
    try:
        callback(outcome)
    except Exception:
        log.exception("a send_async callback raised")
