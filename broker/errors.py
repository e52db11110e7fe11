"""What the broker's storage formats raise on purpose: operating errors with fields a caller uses.

Bugs (a caller breaking an API precondition, such as a ConsumeQueue append out of order) are
asserts, not these. Everything here can happen to correct code: a disk flips a byte, a client
sends a property value with a separator in it, an operator types a malformed message id.
"""

from __future__ import annotations

import attrs


class FormatError(Exception):
    """Base of every error the broker's storage formats raise on purpose."""


@attrs.define
class CorruptConsumeQueue(FormatError):
    """A ConsumeQueue file or unit that fails a check (outside a tail that recovery cuts)."""

    path: str
    queue_offset: int
    reason: str

    def __str__(self) -> str:
        return (
            f"corrupt consume queue {self.path} at queue offset {self.queue_offset}: {self.reason}"
        )


@attrs.define
class QueueOffsetOutOfRange(FormatError):
    """A ConsumeQueue read outside [min_queue_offset, max_queue_offset)."""

    queue_offset: int
    min_queue_offset: int
    max_queue_offset: int  # one past the last unit

    def __str__(self) -> str:
        return (
            f"queue offset {self.queue_offset} is outside the queue's "
            f"{self.min_queue_offset}..{self.max_queue_offset - 1}"
        )


@attrs.define
class BadQueueName(FormatError):
    """A topic or queue id that cannot name a ConsumeQueue directory."""

    topic: str
    queue_id: int
    reason: str

    def __str__(self) -> str:
        return f"no consume queue for topic {self.topic!r} queue {self.queue_id}: {self.reason}"


@attrs.define
class CorruptIndexFile(FormatError):
    """An IndexFile whose header or geometry does not hold together."""

    path: str
    reason: str

    def __str__(self) -> str:
        return f"corrupt index file {self.path}: {self.reason}"
