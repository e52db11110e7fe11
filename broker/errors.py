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
class CorruptMessage(FormatError):
    """A stored message that fails a check when read back."""

    at: int  # where the record starts in the buffer it was read from
    reason: str  # "bad magic 0x...", "body crc mismatch", "size 90 but fields end at 203", ...

    def __str__(self) -> str:
        return f"corrupt stored message at {self.at}: {self.reason}"


@attrs.define
class MessageTooLarge(FormatError):
    """A stored record longer than one log entry may carry."""

    size: int  # the record's store_size
    limit: int

    def __str__(self) -> str:
        return f"stored message of {self.size} bytes exceeds the limit of {self.limit} bytes"


@attrs.define
class BadProperty(FormatError):
    """A property the properties string cannot carry (a separator inside it, an empty key)."""

    key: str
    reason: str

    def __str__(self) -> str:
        return f"property {self.key!r} cannot be stored: {self.reason}"


@attrs.define
class PropertiesTooLong(FormatError):
    """Encoded properties longer than their int16 length field holds."""

    size: int  # bytes, UTF-8
    limit: int

    def __str__(self) -> str:
        return f"properties of {self.size} bytes exceed the limit of {self.limit} bytes"


@attrs.define
class TopicTooLong(FormatError):
    """A topic longer than the stored message's topic length field holds."""

    topic: str
    size: int  # bytes, UTF-8
    limit: int

    def __str__(self) -> str:
        return f"topic of {self.size} bytes exceeds the limit of {self.limit} bytes"


@attrs.define
class BadMessageId(FormatError):
    """A message id string that is not one of the formats it claims to be."""

    text: str
    reason: str

    def __str__(self) -> str:
        return f"bad message id {self.text!r}: {self.reason}"


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
