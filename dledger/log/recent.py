"""The entries appended last, kept in memory for the reader that comes right after the writer.

A replica applies what it appended a moment earlier: the leader its own proposals, a follower
what AppendEntries brought. Reading those back from the segment copies every body out of the
map and re-checks its header and CRC, ~7 us an entry of 1 KiB, about an eighth of what a broker
replica spends on a message (docs/decisions.md, "The applier reads what was just appended from
memory"). So the store keeps the last batches it appended, up to a byte bound, and a read that
falls wholly inside them is answered from here. They are the same bytes objects the writer
wrote, so an answer from here equals one from disk; anything that removes entries (a Raft
truncation, a reset) cuts or clears this first. Entries in memory are not re-verified: the
disk's own checks still run for every read that reaches it, and at every open.
"""

from __future__ import annotations

from collections import deque

from dledger.raft.entries import EntryBatch


class RecentAppends:
    """Consecutive appended batches, the oldest dropped once their bodies pass `bytes_max`."""

    def __init__(self, bytes_max: int) -> None:
        self.bytes_max = bytes_max
        self._batches: deque[tuple[EntryBatch, int]] = deque()  # (batch, its body bytes)
        self._bytes = 0

    def add(self, batch: EntryBatch, body_bytes: int) -> None:
        """`batch` was just appended (after every batch added before, or the log was cut
        since: then what is held no longer precedes it and is dropped)."""
        if not len(batch):
            return
        if set(map(type, batch.payloads)) != {bytes}:
            self.clear()  # a mutable buffer could change under us: such entries are read back
            return
        batches = self._batches
        if batches and batches[-1][0].last_index + 1 != batch.first_index:
            self.clear()
        batches.append((batch, body_bytes))
        self._bytes += body_bytes
        while self._bytes > self.bytes_max and len(batches) > 1:
            self._bytes -= batches.popleft()[1]

    def cut_after(self, index: int) -> None:
        """Entries after `index` are gone from the log."""
        batches = self._batches
        while batches and batches[-1][0].last_index > index:
            batch, body_bytes = batches.pop()
            self._bytes -= body_bytes
            if batch.first_index <= index:
                kept = batch.slice(batch.first_index, index)
                kept_bytes = kept.payload_bytes()
                batches.append((kept, kept_bytes))
                self._bytes += kept_bytes
                return

    def clear(self) -> None:
        self._batches.clear()
        self._bytes = 0

    def read(self, lo: int, hi: int, bytes_max: int) -> EntryBatch | None:
        """Entries lo..hi as the segment reader gives them (stopping before the bodies pass
        `bytes_max`, at least one), or None unless all of lo..hi are held."""
        batches = self._batches
        if not batches or lo < batches[0][0].first_index or hi > batches[-1][0].last_index:
            return None
        k = len(batches) - 1
        while batches[k][0].first_index > lo:  # readers ask for the newest entries: from the end
            k -= 1
        terms: list[int] = []
        kinds: list[int] = []
        payloads: list[bytes] = []
        total = 0
        index = lo
        while index <= hi:
            batch = batches[k][0]
            a = index - batch.first_index
            b = min(hi, batch.last_index) - batch.first_index + 1
            taken = 0
            for p in batch.payloads[a:b]:
                if payloads and total + len(p) > bytes_max:
                    break
                total += len(p)
                payloads.append(p)
                taken += 1
            terms.extend(batch.terms[a : a + taken])
            kinds.extend(batch.kinds[a : a + taken])
            if taken < b - a:
                break
            index = batch.first_index + b
            k += 1
        return EntryBatch(lo, terms, kinds, payloads)
