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

from bisect import bisect_right
from collections import deque
from collections.abc import Sequence
from itertools import accumulate

from dledger.raft.entries import EntryBatch


class _Held:
    """One appended batch, with the running total of its body sizes (`ends[k]` = bytes of
    bodies 0..k-1, so `ends[-1]` is the batch's) and where each entry starts in the log."""

    __slots__ = ("batch", "ends", "positions")

    def __init__(self, batch: EntryBatch, ends: list[int], positions: Sequence[int]) -> None:
        self.batch = batch
        self.ends = ends
        self.positions = positions


class RecentAppends:
    """Consecutive appended batches, the oldest dropped once their bodies pass `bytes_max`.

    A read cuts each batch it spans with one binary search over the running totals of body
    sizes, so it costs a few C calls a batch, not a Python step an entry: every replica reads
    every entry it applies from here, and positions too (the broker's physical offsets)."""

    def __init__(self, bytes_max: int) -> None:
        self.bytes_max = bytes_max
        self._batches: deque[_Held] = deque()
        self._bytes = 0

    def add(self, batch: EntryBatch, positions: Sequence[int], lengths: Sequence[int]) -> None:
        """`batch` was just appended, its entries at `positions`, its bodies `lengths` bytes
        long (after every batch added before, or the log was cut since: then what is held no
        longer precedes it and is dropped)."""
        if not len(batch):
            return
        assert len(positions) == len(lengths) == len(batch), (len(positions), len(batch))
        if set(map(type, batch.payloads)) != {bytes}:
            self.clear()  # a mutable buffer could change under us: such entries are read back
            return
        batches = self._batches
        if batches and batches[-1].batch.last_index + 1 != batch.first_index:
            self.clear()
        ends = list(accumulate(lengths, initial=0))
        batches.append(_Held(batch, ends, positions))
        self._bytes += ends[-1]
        while self._bytes > self.bytes_max and len(batches) > 1:
            self._bytes -= batches.popleft().ends[-1]

    def cut_after(self, index: int) -> None:
        """Entries after `index` are gone from the log."""
        batches = self._batches
        while batches and batches[-1].batch.last_index > index:
            held = batches.pop()
            self._bytes -= held.ends[-1]
            batch = held.batch
            if batch.first_index <= index:
                count = index - batch.first_index + 1
                kept = _Held(
                    batch.slice(batch.first_index, index),
                    held.ends[: count + 1],
                    held.positions[:count],
                )
                batches.append(kept)
                self._bytes += kept.ends[-1]
                return

    def clear(self) -> None:
        self._batches.clear()
        self._bytes = 0

    def _first_holding(self, lo: int, hi: int) -> int | None:
        """Which held batch has entry `lo`, or None unless all of lo..hi are held."""
        batches = self._batches
        if not batches or lo < batches[0].batch.first_index or hi > batches[-1].batch.last_index:
            return None
        k = len(batches) - 1
        while batches[k].batch.first_index > lo:  # readers ask for the newest entries
            k -= 1
        return k

    def read(self, lo: int, hi: int, bytes_max: int) -> EntryBatch | None:
        """Entries lo..hi as the segment reader gives them (stopping before the bodies pass
        `bytes_max`, at least one), or None unless all of lo..hi are held."""
        k = self._first_holding(lo, hi)
        if k is None:
            return None
        batches = self._batches
        terms: list[int] = []
        kinds: list[int] = []
        payloads: list[bytes] = []
        left = bytes_max  # body bytes still allowed
        index = lo
        while index <= hi:
            held = batches[k]
            batch, ends = held.batch, held.ends
            a = index - batch.first_index
            b = min(hi, batch.last_index) - batch.first_index + 1
            # the longest prefix a..end-1 whose bodies fit in what is left
            end = max(a, bisect_right(ends, ends[a] + left, a, b + 1) - 1)
            if end == a and not payloads:
                end = a + 1  # the first entry is read whatever its size
            left -= ends[end] - ends[a]
            payloads += batch.payloads[a:end]
            terms += batch.terms[a:end]
            kinds += batch.kinds[a:end]
            if end < b:
                break
            index = batch.first_index + b
            k += 1
        return EntryBatch(lo, terms, kinds, payloads)

    def positions(self, lo: int, hi: int) -> list[int] | None:
        """Where entries lo..hi start in the log, or None unless all of them are held."""
        k = self._first_holding(lo, hi)
        if k is None:
            return None
        batches = self._batches
        out: list[int] = []
        index = lo
        while index <= hi:
            held = batches[k]
            first = held.batch.first_index
            out += held.positions[index - first : min(hi, held.batch.last_index) - first + 1]
            index = held.batch.last_index + 1
            k += 1
        return out
