"""Which queue a message goes to: round robin with the fault tracker for ordinary sends, a
selector of the application's for ordered ones.

A selector is `selector(queues, message, arg) -> MessageQueue`, called with the topic's write
queues in a stable order (by broker name, then queue id). `hash_selector` is the ready one: the
same `arg` (a sharding key: an order id, a user id) always gives the same queue, in this process
and in every other, as long as the topic's queues stay the same. It hashes with CRC-32 of
`str(arg)`, never Python's hash(), which differs between processes (PYTHONHASHSEED).
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Callable, Collection, Sequence
from typing import Any

from client.fault import FaultTracker
from client.message import Message, MessageQueue

Selector = Callable[[list[MessageQueue], Message, Any], MessageQueue]


def hash_selector(queues: Sequence[MessageQueue], message: Message, arg: Any) -> MessageQueue:
    """queues[crc32(str(arg)) % len(queues)]: stable across processes and runs."""
    del message  # the choice depends on the key only
    return queues[zlib.crc32(str(arg).encode()) % len(queues)]


class RoundRobin:
    """Picks queues in turn, one counter per topic starting at a random place (Java's
    ThreadLocalIndex), so producers started together do not all begin on queue 0."""

    def __init__(self, rng: random.Random | None = None) -> None:
        self._rng = rng or random.Random()
        self._next: dict[str, int] = {}

    def pick(
        self, queues: Sequence[MessageQueue], tracker: FaultTracker, tried: Collection[str]
    ) -> MessageQueue:
        """The next queue, preferring in turn: a group not yet tried by this send and not
        avoided; any group not yet tried (the least avoided); any group not avoided; the least
        avoided group. `tried` holds the broker names earlier attempts of this send went to."""
        assert queues, "no queue to pick from"
        topic = queues[0].topic
        start = self._next.get(topic)
        if start is None:
            start = self._rng.randrange(len(queues))
        self._next[topic] = start + 1
        count = len(queues)
        order = [queues[(start + i) % count] for i in range(count)]
        untried = [q for q in order if q.broker_name not in tried]
        for candidates in (untried, order):
            if not candidates:
                continue
            for queue in candidates:
                if tracker.available(queue.broker_name):
                    return queue
            best = tracker.least_avoided(q.broker_name for q in candidates)
            return next(q for q in candidates if q.broker_name == best)
        raise AssertionError("unreachable: order is not empty")
