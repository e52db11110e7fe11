"""What a push consumer's listener returns, and the listener types.

A concurrent listener takes a batch of messages (`consume_batch_size`, default 1) from any of
the consumer's queues and returns `ConsumeStatus`; an orderly listener takes a batch from one
queue at a time, in queue order, and returns `ConsumeOrderlyStatus`. A listener may be an
`async def` (awaited on the consumer's trio loop) or a plain function (run in one of the
consumer's worker threads, so a slow listener never blocks the loop). An exception raised by
a listener (or an answer that is not a status) counts as RECONSUME_LATER / SUSPEND_CURRENT_QUEUE_A_MOMENT and is logged.
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable

from client.message import MessageExt


class ConsumeStatus(enum.Enum):
    """A concurrent listener's answer for its whole batch (RocketMQ's ConsumeConcurrentlyStatus)."""

    CONSUME_SUCCESS = "CONSUME_SUCCESS"
    RECONSUME_LATER = "RECONSUME_LATER"


class ConsumeOrderlyStatus(enum.Enum):
    """An orderly listener's answer: SUCCESS moves the queue on; SUSPEND_CURRENT_QUEUE_A_MOMENT
    hands the same messages to the listener again after a pause (`suspend_s`)."""

    SUCCESS = "SUCCESS"
    SUSPEND_CURRENT_QUEUE_A_MOMENT = "SUSPEND_CURRENT_QUEUE_A_MOMENT"


ConcurrentListener = Callable[[list[MessageExt]], ConsumeStatus | Awaitable[ConsumeStatus]]
OrderlyListener = Callable[
    [list[MessageExt]], ConsumeOrderlyStatus | Awaitable[ConsumeOrderlyStatus]
]
