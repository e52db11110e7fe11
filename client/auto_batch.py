"""Automatic batching: concurrent sends of one topic share SEND_BATCH_MESSAGE requests.

With `AsyncProducer(..., auto_batch=True)`, a send without a selector (sync or async) does not
get a request of its own: it joins its topic's queue, and up to `AUTO_BATCH_IN_FLIGHT` batch
requests per topic carry what has queued, each as one batch (one log append on the broker, so
all or nothing). There is no linger: a lone send leaves at once as a batch of one; batches
grow only while earlier requests are in flight, i.e. under load, which is when per-request
costs (a header each way, a task, a log append) dominate. While one request is in flight, a
second leaves only once `AUTO_BATCH_EAGER_MESSAGES` wait, and a carrier whose request came back
goes on only if that many wait or no other request is in flight: otherwise every answer freed
room for a few sends that left at once as a batch of one or two (most requests were that
small in a windowed load, at a broker cost per request that a 64-message batch pays once).
RocketMQ 5's Java producer calls the same idea `autoBatch`.

Every message is still acknowledged on its own: its SendResult carries its own UNIQ_KEY,
offsetMsgId and queue offset, read from the batch's answer, and a failure reaches each message
of the batch (a SendOutcomeUnknown with that message's own UNIQ_KEY). A batch goes to one
queue, so messages sent this way are spread over queues batch by batch, not message by message.
Messages with a delay level are not batched (a batch cannot carry one).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Awaitable, Callable

import attrs
import trio

from client import limits
from client.errors import SendOutcomeUnknown
from client.message import Message, MessageQueue
from client.send_request import Outgoing, batch_outgoing, prepare_record, uniq_key_of
from client.send_result import SendResult
from remoting.message_id import UniqIdGenerator

log = logging.getLogger("client.auto_batch")

SendOutgoing = Callable[[Outgoing, float], Awaitable[SendResult]]
Outcome = SendResult | Exception


@attrs.define
class Waiting:
    """One message in its topic's queue, until its batch's answer."""

    record: bytes  # in a batch body, with its UNIQ_KEY (send_request.prepare_record)
    uniq_key: str
    size: int  # as the batch splitter counts it
    deadline: float
    done: Callable[[Outcome], None]


@attrs.define
class _Topic:
    waiting: deque[Waiting] = attrs.field(factory=deque)
    in_flight: int = 0


class AutoBatcher:
    def __init__(
        self,
        nursery: trio.Nursery,
        ids: UniqIdGenerator,
        send: SendOutgoing,
        *,
        in_flight_max: int = limits.AUTO_BATCH_IN_FLIGHT,
    ) -> None:
        self._nursery = nursery
        self._ids = ids
        self._send = send
        self._in_flight_max = in_flight_max
        self._topics: dict[str, _Topic] = {}

    def add(self, message: Message, deadline: float, done: Callable[[Outcome], None]) -> str:
        """Queue `message` (validated, without a delay level); `done` gets its outcome. Returns
        its UNIQ_KEY."""
        key = uniq_key_of(message, self._ids)
        record, size = prepare_record(message, key)  # once, here: raises InvalidMessage
        topic = self._topics.setdefault(message.topic, _Topic())
        topic.waiting.append(Waiting(record, key, size, deadline, done))
        if not topic.in_flight or (
            topic.in_flight < self._in_flight_max
            and len(topic.waiting) >= limits.AUTO_BATCH_EAGER_MESSAGES
        ):
            topic.in_flight += 1
            self._nursery.start_soon(self._carry, message.topic, topic)
        return key

    async def send(self, message: Message, deadline: float) -> SendResult:
        """Queue `message` and wait for its own result (or raise its own error)."""
        got = trio.Event()
        outcome: list[Outcome] = []

        def done(result: Outcome) -> None:
            outcome.append(result)
            got.set()

        self.add(message, deadline, done)
        await got.wait()
        if isinstance(outcome[0], Exception):
            raise outcome[0]
        return outcome[0]

    async def _carry(self, name: str, topic: _Topic) -> None:
        """Send what waits, batch after batch, until nothing does."""
        try:
            while topic.waiting:
                await self._one_batch(name, self._take(topic.waiting))
                if topic.in_flight > 1 and len(topic.waiting) < limits.AUTO_BATCH_EAGER_MESSAGES:
                    break  # another request is in flight: its carrier takes what waits
        finally:
            topic.in_flight -= 1
            if not topic.in_flight and not topic.waiting:
                self._topics.pop(name, None)

    @staticmethod
    def _take(waiting: deque[Waiting]) -> list[Waiting]:
        taken = [waiting.popleft()]
        total = taken[0].size
        while (
            waiting
            and len(taken) < limits.BATCH_MESSAGES_MAX
            and total + waiting[0].size <= limits.BATCH_BYTES_MAX
        ):
            total += waiting[0].size
            taken.append(waiting.popleft())
        return taken

    async def _one_batch(self, topic: str, taken: list[Waiting]) -> None:
        deadline = min(w.deadline for w in taken)
        try:
            outgoing = batch_outgoing(topic, [w.record for w in taken], [w.uniq_key for w in taken])
            result = await self._send(outgoing, deadline)
        except Exception as err:  # each message hears of it, in its own words
            for w in taken:
                w.done(_own_error(err, topic, w.uniq_key))
            return
        for w, own in zip(taken, split_result(result, len(taken)), strict=True):
            w.done(own)


def split_result(result: SendResult, count: int) -> list[SendResult]:
    """One SendResult per message of a stored batch, read from the batch's."""
    keys = result.msg_id.split(",")
    stored_ids = result.offset_msg_id.split(",")
    assert len(keys) == count, (len(keys), count)
    if len(stored_ids) != count:  # a broker that names only the first (not ours): keep that
        stored_ids = [result.offset_msg_id] * count
    queue: MessageQueue = result.queue
    return [
        SendResult(result.status, keys[i], stored_ids[i], queue, result.queue_offset + i)
        for i in range(count)
    ]


def _own_error(err: Exception, topic: str, uniq_key: str) -> Exception:
    if isinstance(err, SendOutcomeUnknown):
        own = SendOutcomeUnknown(topic, uniq_key, f"its batch's outcome is unknown: {err.cause}")
        own.__cause__ = err
        return own
    return err
