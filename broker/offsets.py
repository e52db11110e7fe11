"""Consumer offsets: committed through the log, coalesced so they never dominate it.

UPDATE_CONSUMER_OFFSET (and the commit piggy-backed on a pull) lands in a pending table on the
replica that received it; every OFFSET_COALESCE_MS the table goes into the log as one metadata
entry (through the leader, forwarded when this replica follows). A failover therefore loses at
most the commits of the last interval, and consumers rewind at most that far.

Each commit carries the time this replica received it, into the log too: a replica cut off
from its leader keeps its commits and writes them once it can, possibly after another replica
wrote newer commits of the same queue, and the older must not win (Metadata applies the newest
by that time). Reads answer the newest this replica knows: pending, in flight or applied.

A consumer taking a queue reads where to start (QUERY_CONSUMER_OFFSET) from whichever replica
it reaches, and a replica's applied state may lag the group's commit: just restarted, it knows
the log but not yet which of it is committed; cut off, it has not received the newest entries.
So a read first settles: it waits until this replica has applied an entry of offsets written
after the read arrived (a round of this coalescer, written at once, empty when nothing is
pending), which orders it after every commit the log held when it arrived. Found by the second
30-minute broker soak: a replica restarted with the whole group answered an offset from before
its last applied checkpoint while the newer one was in its log, committed.
"""

from __future__ import annotations

import logging
import time

import trio

from broker.entries import encode_meta
from broker.metadata import Metadata, OffsetKey
from broker.state import BrokerState
from broker.writes import WriteFailed, WritePath, WriteUnknown

log = logging.getLogger("broker.offsets")

OFFSET_COALESCE_MS = 200  # the most a failover can forget of committed offsets (issue: <= 500)
OFFSET_WRITE_TIMEOUT_S = 3.0
OFFSETS_PER_ENTRY_MAX = 20_000  # one metadata entry stays far below the entry size limit
# A read waits this long to settle, then answers from what this replica has (a stale offset
# rewinds a consumer, which is safe; an error is not: RocketMQ clients take a failed offset query
# as "no offset" and may start at the queue's end). Below a client's 3 s request timeout.
SETTLE_TIMEOUT_S = 2.0


class OffsetCoalescer:
    def __init__(self, state: BrokerState, writes: WritePath) -> None:
        self._state = state
        self._writes = writes
        self._pending: dict[OffsetKey, tuple[int, int]] = {}  # (offset, received ms)
        self._in_flight: dict[OffsetKey, tuple[int, int]] = {}
        self._wake = trio.Event()
        self._hurry = trio.Event()
        self._rounds_started = 0  # appends of offset entries begun
        self._rounds_applied = 0  # the latest of them this replica has applied
        self._round_ended = trio.Event()
        self._settling = 0  # reads waiting for a round
        self.entries_written = 0

    def commit(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        self._pending[(group, topic, queue_id)] = (offset, int(time.time() * 1000))
        self._wake.set()

    def query(self, group: str, topic: str, queue_id: int) -> int | None:
        """The newest commit this replica knows of (ties: the one not yet written)."""
        key = (group, topic, queue_id)
        found = [table[key] for table in (self._pending, self._in_flight) if key in table]
        metadata = self._state.metadata
        applied = metadata.offsets.get(key)
        if applied is not None:
            found.append((applied, metadata.offset_times.get(key, -1)))
        if not found:
            return None
        return max(found, key=lambda commit: commit[1])[0]  # max keeps the first of equals

    async def settle(self, timeout_s: float = SETTLE_TIMEOUT_S) -> bool:
        """Wait until this replica has applied a round of offsets begun after this call (so
        every commit in the log when it was called); False if that took longer than
        `timeout_s` (no leader, say)."""
        wanted = self._rounds_started + 1
        self._settling += 1
        try:
            self._hurry.set()
            self._wake.set()
            with trio.move_on_after(timeout_s):
                while self._rounds_applied < wanted:
                    await self._round_ended.wait()
                return True
            return False
        finally:
            self._settling -= 1

    async def run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake = trio.Event()
            with trio.move_on_after(OFFSET_COALESCE_MS / 1000):
                await self._hurry.wait()  # a read is waiting: write now
            # a failed round is retried after the pause, also for reads still waiting
            await self.write_pending(at_least_once=self._settling > 0)

    async def write_pending(self, *, at_least_once: bool = False) -> None:
        """Write the pending commits, in entries of at most OFFSETS_PER_ENTRY_MAX;
        `at_least_once`: one entry even when nothing is pending (a read's settling round)."""
        self._hurry = trio.Event()
        while self._pending or at_least_once:
            at_least_once = False
            keys = list(self._pending)[:OFFSETS_PER_ENTRY_MAX]
            batch = {key: self._pending.pop(key) for key in keys}
            self._in_flight.update(batch)
            body = encode_meta(Metadata.offsets_op((k, o, at) for k, (o, at) in batch.items()))
            self._rounds_started += 1
            round_number = self._rounds_started
            try:
                written = await self._writes.append([body], OFFSET_WRITE_TIMEOUT_S)
                self.entries_written += 1
                # reads answer from the in-flight table until this replica has applied the
                # entry: between its commit and its apply the metadata still holds the old
                # offsets, and a consumer taking the queue over would start there
                with trio.move_on_after(OFFSET_WRITE_TIMEOUT_S):
                    await self._state.wait_applied(written.last_index)
                    self._round_applied(round_number)
            except (WriteFailed, WriteUnknown) as err:
                log.warning("consumer offsets not written (%s); kept for the next round", err)
                for key, commit in batch.items():
                    self._pending.setdefault(key, commit)
                self._wake.set()
                return
            finally:
                for key, commit in batch.items():
                    if self._in_flight.get(key) == commit:
                        del self._in_flight[key]

    def _round_applied(self, round_number: int) -> None:
        self._rounds_applied = max(self._rounds_applied, round_number)
        self._round_ended.set()
        self._round_ended = trio.Event()
