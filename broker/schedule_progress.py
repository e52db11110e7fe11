"""Which schedule records have been delivered: RocketMQ's delayOffset.json, kept in the log.

Per schedule queue (SCHEDULE_TOPIC_XXXX's level queues, rmq_sys_wheel_timer's queue) a
watermark, every queue offset below it delivered, and the delivered offsets above it
(`ahead`). Level queues are delivered in order, so their `ahead` stays empty; the timer queue
is delivered in due order, and the leader rolls its oldest records forward so that the
watermark keeps up (broker/schedule.py) and `ahead` stays below TIMER_WINDOW_MAX.

It changes only as the log is applied, on every replica alike: a delivered message carrying
SCHEDULE_SOURCE marks its source (broker/state.py turns it into a "delivered" operation), and
a "schedule_skip" operation moves a watermark past records retention deleted. So a new leader
knows exactly which records were delivered. It is part of the metadata (snapshots and the
checkpoint carry it as `schedule`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import attrs

from broker.delays import Source

QueueKey = tuple[str, int]


@attrs.define
class QueueProgress:
    watermark: int = 0  # every offset below is delivered
    ahead: set[int] = attrs.field(factory=set)  # delivered offsets >= watermark

    def delivered(self, offset: int) -> bool:
        return offset < self.watermark or offset in self.ahead

    def mark(self, offset: int) -> None:
        if offset < self.watermark:
            return
        self.ahead.add(offset)
        while self.watermark in self.ahead:
            self.ahead.remove(self.watermark)
            self.watermark += 1

    def skip_to(self, offset: int) -> None:
        if offset <= self.watermark:
            return
        self.watermark = offset
        self.ahead = {o for o in self.ahead if o >= offset}
        while self.watermark in self.ahead:
            self.ahead.remove(self.watermark)
            self.watermark += 1


class DeliveryProgress:
    """Every schedule queue's progress; a queue never delivered from has watermark 0."""

    def __init__(self) -> None:
        self.queues: dict[QueueKey, QueueProgress] = {}

    def of(self, topic: str, queue_id: int) -> QueueProgress:
        progress = self.queues.get((topic, queue_id))
        return progress if progress is not None else QueueProgress()

    def delivered(self, source: Source) -> bool:
        progress = self.queues.get((source.topic, source.queue_id))
        return progress is not None and progress.delivered(source.queue_offset)

    def apply(self, op: Mapping[str, Any]) -> None:
        """A "delivered" or "schedule_skip" operation (docs/formats.md#metadata-entry)."""
        key = (str(op["topic"]), int(op["queue_id"]))
        progress = self.queues.setdefault(key, QueueProgress())
        if op["op"] == "delivered":
            progress.mark(int(op["offset"]))
        else:
            progress.skip_to(int(op["offset"]))

    @staticmethod
    def delivered_op(source: Source) -> dict[str, Any]:
        return {
            "op": "delivered",
            "topic": source.topic,
            "queue_id": source.queue_id,
            "offset": source.queue_offset,
        }

    @staticmethod
    def skip_op(topic: str, queue_id: int, offset: int) -> dict[str, Any]:
        """Every record of the queue below `offset` counts as delivered (they are gone)."""
        return {"op": "schedule_skip", "topic": topic, "queue_id": queue_id, "offset": offset}

    def state(self) -> list[list[Any]]:
        return [
            [topic, queue_id, p.watermark, sorted(p.ahead)]
            for (topic, queue_id), p in sorted(self.queues.items())
        ]

    def restore(self, rows: Iterable[list[Any]]) -> None:
        self.queues = {
            (str(topic), int(queue_id)): QueueProgress(int(watermark), {int(o) for o in ahead})
            for topic, queue_id, watermark, ahead in rows
        }
