"""Listeners that record what they were given, and polling waits, for the push consumer tests."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable

import attrs
import trio

from client.listeners import ConsumeOrderlyStatus, ConsumeStatus
from client.message import MessageExt, MessageQueue
from client.push_consumer import AsyncPushConsumer

POLL_S = 0.05


@attrs.frozen
class Delivery:
    member: str
    message: MessageExt
    began: float  # trio time
    ended: float


@attrs.define
class Recorder:
    deliveries: list[Delivery] = attrs.field(factory=list)

    def concurrent(self, member: str) -> Callable[[list[MessageExt]], Awaitable[ConsumeStatus]]:
        async def listener(messages: list[MessageExt]) -> ConsumeStatus:
            now = trio.current_time()
            self.deliveries += [Delivery(member, m, now, now) for m in messages]
            return ConsumeStatus.CONSUME_SUCCESS

        return listener

    def orderly(
        self, member: str, work_s: float = 0.0
    ) -> Callable[[list[MessageExt]], Awaitable[ConsumeOrderlyStatus]]:
        async def listener(messages: list[MessageExt]) -> ConsumeOrderlyStatus:
            began = trio.current_time()
            if work_s:
                await trio.sleep(work_s)
            ended = trio.current_time()
            self.deliveries += [Delivery(member, m, began, ended) for m in messages]
            return ConsumeOrderlyStatus.SUCCESS

        return listener

    def ids(self, member: str | None = None) -> list[str]:
        return [d.message.msg_id for d in self.deliveries if member in (None, d.member)]

    def unique(self) -> set[str]:
        return set(self.ids())


async def wait_for(
    predicate: Callable[[], bool],
    timeout_s: float,
    what: str,
    state: Callable[[], object] | None = None,
) -> float:
    """Poll until `predicate()`; the seconds it took. Fails naming `what` after `timeout_s`,
    with `state()` when given (what the test saw, for a failure that does not recur)."""
    began = trio.current_time()
    with trio.move_on_after(timeout_s):
        while not predicate():
            await trio.sleep(POLL_S)
        return trio.current_time() - began
    seen = "" if state is None else f"; {state()}"
    raise AssertionError(f"{what}: not within {timeout_s} s{seen}")


def partition(consumers: Iterable[AsyncPushConsumer], queues: Iterable[MessageQueue]) -> bool:
    """Whether every queue of `queues` is owned by exactly one of `consumers` (their %RETRY%
    queues not counted)."""
    wanted = sorted(queues)
    topics = {q.topic for q in wanted}
    owned = [q for c in consumers for q in c.assigned_queues() if q.topic in topics]
    return sorted(owned) == wanted


def started(consumers: Iterable[AsyncPushConsumer]) -> bool:
    """Whether every owned queue of every consumer knows where it starts."""
    return all(o is not None for c in consumers for o in c.consume_offsets().values())


def shares(consumers: Iterable[AsyncPushConsumer], topic: str) -> list[int]:
    return [sum(q.topic == topic for q in c.assigned_queues()) for c in consumers]
