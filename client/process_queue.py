"""The messages of one owned queue between its pull and their consumption (RocketMQ's
ProcessQueue), flow control, and the offset it is safe to commit.

Messages are put in queue-offset order as pulls bring them and removed as the listener
finishes with them, in any order (concurrent consumption) or a batch at a time (orderly:
`take`, then `commit_taken` or `return_taken`). The offset to commit is the lowest offset not
yet consumed: the first message still held, or, with none held, where the next pull starts
(`pulled_to`, past messages the tag filter dropped). So a consumer that crashes re-delivers
from there rather than skipping a message that was pulled but not consumed.

Flow control: the pull loop stops pulling while the queue holds more than `count_max`
messages or `bytes_max` bytes of bodies or, for concurrent consumption, messages spanning more
than `span_max` offsets (one slow message holding the commit offset back), and resumes as
consumption drains it (`wait_for_room`).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable

import attrs
import trio

from client.message import MessageExt, MessageQueue

MiB = 1 << 20
CACHED_MESSAGES_MAX = 1000  # pullThresholdForQueue
CACHED_BYTES_MAX = 100 * MiB  # pullThresholdSizeForQueue (100 MiB)
OFFSET_SPAN_MAX = 2000  # consumeConcurrentlyMaxSpan
LOCK_VALID_S = 30.0  # REBALANCE_LOCK_MAX_LIVE_TIME: a lock not renewed this long is not trusted
# (the broker's lease is 60 s: LOCK_EXPIRY_MS in broker/metadata.py, RocketMQ's 60 s)


@attrs.frozen
class FlowLimits:
    count_max: int = CACHED_MESSAGES_MAX
    bytes_max: int = CACHED_BYTES_MAX
    span_max: int | None = OFFSET_SPAN_MAX  # None: not checked (orderly consumption)

    def __attrs_post_init__(self) -> None:
        if self.count_max < 1 or self.bytes_max < 1:
            raise ValueError(f"flow limits must be positive: {self}")
        if self.span_max is not None and self.span_max < 1:
            raise ValueError(f"span_max must be positive or None: {self.span_max}")


@attrs.frozen
class ProcessQueueInfo:
    """A snapshot of one owned queue, for monitoring (RocketMQ's ProcessQueueInfo)."""

    cached_count: int  # messages held: pulled, not yet consumed
    cached_bytes: int  # their bodies' bytes
    span: int  # offsets between the first and last held
    commit_offset: int | None  # what a commit says now
    pulled_to: int | None  # where the next pull starts
    consuming: int  # batches with a listener now
    locked: bool  # the broker lock, as last granted (orderly clustering)


class ProcessQueue:
    def __init__(self, queue: MessageQueue, start_offset: int | None = None) -> None:
        self.queue = queue
        # offset -> message, in increasing offset order (puts come in order; removal keeps it)
        # by offset, in offset order; OrderedDicts, because the first key is read after every
        # removal from the front, and a dict walks every slot freed at its front to find it
        self._held: OrderedDict[int, MessageExt] = OrderedDict()
        self._taken: OrderedDict[int, MessageExt] = OrderedDict()  # orderly: with the listener
        self.bytes = 0
        self.pulled_to: int | None = start_offset  # where the next pull starts; None: not known
        self.dropped = False  # no more pulls nor new batches (the queue went elsewhere)
        self.released = False  # its offset is written out: late results are ignored
        self.consuming = 0  # batches with a listener now
        # orderly consumption in clustering mode: the broker lock, as last granted
        self.locked = False
        self.locked_at = -1e9  # trio time of the last grant
        self._changed = trio.Event()

    # --- the pull side ---------------------------------------------------------------------

    def start_at(self, offset: int) -> None:
        """Set where pulling starts (the committed offset, or where consume_from says)."""
        assert not self._held and not self._taken, "the start moves only while nothing is held"
        self.pulled_to = offset

    def put(self, messages: Iterable[MessageExt], next_offset: int) -> list[MessageExt]:
        """Hold a pull's messages; `next_offset` is the pull's nextBeginOffset. Returns the
        messages newly held (one already held, or below where the queue had pulled to, is
        not held twice)."""
        added = []
        floor = self.pulled_to if self.pulled_to is not None else -1
        for message in messages:
            offset = message.queue_offset
            if offset < floor or offset in self._held or offset in self._taken:
                continue
            self._held[offset] = message
            self.bytes += len(message.body)
            added.append(message)
        self.pulled_to = max(next_offset, floor)
        self._wake()
        return added

    def move_to(self, offset: int) -> None:
        """The broker said the pull offset is out of range (OFFSET_ILLEGAL): pull from
        `offset` from now on; messages still held keep the commit offset below them."""
        self.pulled_to = offset
        self._wake()

    # --- flow control ----------------------------------------------------------------------

    @property
    def count(self) -> int:
        return len(self._held) + len(self._taken)

    @property
    def span(self) -> int:
        """Offsets between the first and last message held (0 with fewer than two)."""
        if len(self._held) < 2:
            return 0
        return next(reversed(self._held)) - next(iter(self._held))

    def over_limit(self, limits: FlowLimits) -> str | None:
        """Why pulling must wait, or None."""
        if self.count > limits.count_max:
            return f"{self.count} messages held (limit {limits.count_max})"
        if self.bytes > limits.bytes_max:
            return f"{self.bytes} bytes held (limit {limits.bytes_max})"
        if limits.span_max is not None and self.span > limits.span_max:
            return f"held messages span {self.span} offsets (limit {limits.span_max})"
        return None

    async def wait_for_room(self, limits: FlowLimits) -> None:
        """Until the queue is under its limits or dropped."""
        while not self.dropped and self.over_limit(limits) is not None:
            await self._changed.wait()

    async def wait_changed(self) -> None:
        await self._changed.wait()

    def _wake(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    def info(self) -> ProcessQueueInfo:
        return ProcessQueueInfo(
            self.count,
            self.bytes,
            self.span,
            self.commit_offset(),
            self.pulled_to,
            self.consuming,
            self.locked,
        )

    # --- the consuming side ----------------------------------------------------------------

    def commit_offset(self) -> int | None:
        """The lowest offset not yet consumed: what a commit may say. None before the start
        is known."""
        lowest = [next(iter(d)) for d in (self._taken, self._held) if d]
        if lowest:
            return min(lowest)
        return self.pulled_to

    def remove(self, messages: Iterable[MessageExt]) -> int | None:
        """Concurrent consumption: these are consumed. Returns the commit offset after."""
        for message in messages:
            if self._held.pop(message.queue_offset, None) is not None:
                self.bytes -= len(message.body)
        self._wake()
        return self.commit_offset()

    @property
    def holds(self) -> bool:
        return bool(self._held)

    def take(self, count: int) -> list[MessageExt]:
        """Orderly consumption: the next `count` messages in offset order, handed out until
        `commit_taken` or `return_taken`."""
        assert not self._taken, "one orderly batch at a time"
        out = []
        for offset in list(self._held)[:count]:
            message = self._held.pop(offset)
            self._taken[offset] = message
            out.append(message)
        return out

    def commit_taken(self) -> int | None:
        """The taken batch is consumed; returns the commit offset after."""
        for message in self._taken.values():
            self.bytes -= len(message.body)
        self._taken.clear()
        self._wake()
        return self.commit_offset()

    def return_taken(self, again: Iterable[MessageExt] | None = None) -> None:
        """The taken batch goes back to the front, to be taken again (SUSPEND...); `again`
        replaces its messages (the same offsets, reconsume_times counted up)."""
        back = {m.queue_offset: m for m in again} if again is not None else dict(self._taken)
        assert back.keys() == self._taken.keys(), "only the taken batch goes back"
        back.update(self._held)
        self._held = OrderedDict(back)
        self._taken.clear()
        self._wake()

    def replace(self, messages: Iterable[MessageExt]) -> None:
        """Swap held messages for new versions of themselves (same offsets)."""
        for message in messages:
            if message.queue_offset in self._held:
                self._held[message.queue_offset] = message

    # --- consumption in progress -----------------------------------------------------------

    def begin_batch(self) -> None:
        self.consuming += 1

    def end_batch(self) -> None:
        self.consuming -= 1
        assert self.consuming >= 0
        self._wake()

    async def wait_idle(self) -> None:
        """Until no listener is running on this queue's messages."""
        while self.consuming:
            await self._changed.wait()

    # --- the lock (orderly, clustering) ----------------------------------------------------

    def lock_valid(self, now: float) -> bool:
        return self.locked and now - self.locked_at < LOCK_VALID_S

    def set_locked(self, locked: bool, now: float) -> None:
        self.locked = locked
        if locked:
            self.locked_at = now
        self._wake()

    def drop(self) -> None:
        self.dropped = True
        self._wake()
