"""The log store against a plain list: random appends, truncations, resets, flushes, reopens
and crash-reopens, with 4 KiB segments and 8-record index files so that rollover, blank
records and index-file boundaries happen all the time."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from dledger import limits
from dledger.log.errors import BelowFirstIndex, Compacted, EntryTooLarge, IndexOutOfRange
from dledger.log.segment import entry_position
from dledger.log.store import LogStore
from dledger.raft.entries import EntryBatch, EntryId, LogStart
from tests.log.helpers import TINY, open_store

SEG = TINY.segment_bytes
BODY_MAX = SEG - limits.ENTRY_HEADER_BYTES - 8  # LogStore.body_bytes_max

bodies = st.one_of(
    st.binary(max_size=200),
    st.integers(BODY_MAX - 150, BODY_MAX).map(lambda n: bytes([n % 251]) * n),
    st.integers(1000, 2100).map(lambda n: bytes([n % 13]) * n),
)


class LogMatchesList(RuleBasedStateMachine):
    """Model: start, and (term, kind, body, position) for every retained entry."""

    @initialize()
    def open(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="logmodel-"))
        self.store: LogStore = open_store(self.dir)
        self.start = LogStart(EntryId(0, 0), 0)
        self.entries: list[tuple[int, int, bytes, int]] = []
        self.write_pos = 0

    def teardown(self) -> None:
        if hasattr(self, "store"):
            self.store.abandon()
            shutil.rmtree(self.dir, ignore_errors=True)

    @property
    def last_index(self) -> int:
        return self.start.prev.index + len(self.entries)

    @property
    def last_term(self) -> int:
        return self.entries[-1][0] if self.entries else self.start.prev.term

    @rule(
        new=st.lists(st.tuples(bodies, st.booleans(), st.sampled_from([0, 1, 2])), max_size=5),
    )
    def append(self, new: list[tuple[bytes, bool, int]]) -> None:
        term = max(self.last_term, 1)
        terms, kinds, payloads = [], [], []
        for body, bump, kind in new:
            term += bump
            terms.append(term)
            kinds.append(kind)
            payloads.append(body)
        batch = EntryBatch(self.last_index + 1, terms, kinds, payloads)
        assert self.store.append(batch) == batch.last_index
        for term, kind, body in zip(terms, kinds, payloads, strict=True):
            size = limits.ENTRY_HEADER_BYTES + len(body)
            position = entry_position(self.write_pos, size, SEG)
            self.entries.append((term, kind, body, position))
            self.write_pos = position + size

    @rule(extra=st.integers(1, 100))
    def append_too_large(self, extra: int) -> None:
        batch = EntryBatch(
            self.last_index + 1,
            [max(self.last_term, 1)] * 2,
            [0, 0],
            [b"ok", bytes(BODY_MAX + extra)],
        )
        with pytest.raises(EntryTooLarge):
            self.store.append(batch)

    @rule(back=st.integers(0, 12))
    def truncate_after(self, back: int) -> None:
        index = self.last_index - back
        if index < self.start.prev.index:
            with pytest.raises(BelowFirstIndex):
                self.store.truncate_after(index)
            return
        self.store.truncate_after(index)
        keep = index - self.start.prev.index
        del self.entries[keep:]
        if self.entries:
            _, _, body, position = self.entries[-1]
            self.write_pos = position + limits.ENTRY_HEADER_BYTES + len(body)
        else:
            self.write_pos = self.start.position
        assert self.store.durable_index <= index

    @rule(gap=st.integers(0, 20), bump=st.integers(0, 2), skip=st.sampled_from([0, 1, 300, SEG]))
    def reset(self, gap: int, bump: int, skip: int) -> None:
        position = self.write_pos + skip
        offset = position % SEG
        if offset and SEG - offset < 8:
            position += SEG - offset
        start = LogStart(EntryId(self.last_index + gap, self.last_term + bump), position)
        self.store.reset(start)
        self.start, self.entries, self.write_pos = start, [], position
        assert self.store.durable_index == start.prev.index

    @rule(bytes_max=st.sampled_from([0, 300, 5000, limits.RECENT_APPENDS_BYTES_MAX]))
    def bound_recent_appends(self, bytes_max: int) -> None:
        """Reads come from the appended batches held in memory while they cover the range, else
        from the segments: small bounds make the two meet inside one read."""
        self.store._recent.bytes_max = bytes_max

    @rule()
    def flush(self) -> None:
        assert self.store.flush() == self.last_index

    @rule()
    def reopen(self) -> None:
        self.store.close()
        self.store = open_store(self.dir)
        report = self.store.recovery
        assert report.clean_shutdown and report.cut_bytes == 0 and report.cut_entries == 0

    @rule()
    def crash_reopen(self) -> None:
        """The process dies: what it wrote is in the page cache, so nothing is lost or cut."""
        self.store.abandon()
        self.store = open_store(self.dir)
        report = self.store.recovery
        assert not report.clean_shutdown
        assert report.cut_bytes == 0 and report.cut_entries == 0, report
        assert self.store.durable_index == self.last_index

    @precondition(lambda self: self.entries)
    @rule(data=st.data())
    def read_range(self, data: st.DataObject) -> None:
        first = self.start.prev.index + 1
        lo = data.draw(st.integers(first, self.last_index))
        hi = data.draw(st.integers(lo, self.last_index))
        budget = data.draw(st.integers(0, 3 * SEG))
        batch = self.store.read(lo, hi, budget)
        assert batch.first_index == lo and 1 <= len(batch) <= hi - lo + 1
        expected = self.entries[lo - first : lo - first + len(batch)]
        assert list(batch.payloads) == [e[2] for e in expected]
        assert list(batch.terms) == [e[0] for e in expected]
        assert list(batch.kinds) == [e[1] for e in expected]
        total = sum(map(len, batch.payloads))
        assert len(batch) == 1 or total <= budget
        if len(batch) < hi - lo + 1:  # stopped early: the next one would not have fit
            assert total + len(self.entries[lo - first + len(batch)][2]) > budget

    @rule()
    def read_outside(self) -> None:
        with pytest.raises(IndexOutOfRange):
            self.store.get(self.last_index + 1)
        if self.start.prev.index > 0:
            with pytest.raises(Compacted) as info:
                self.store.get(self.start.prev.index)
            assert info.value.first_index == self.start.prev.index + 1

    @invariant()
    def same_entries(self) -> None:
        if not hasattr(self, "store"):
            return
        store = self.store
        assert store.start == self.start
        assert store.last_index == self.last_index
        assert store.last_term == self.last_term
        assert store.next_position == self.write_pos
        assert store.durable_index <= store.last_index
        assert store.term_at(self.start.prev.index) == self.start.prev.term
        for k, (term, kind, body, position) in enumerate(self.entries):
            index = self.start.prev.index + 1 + k
            stored = store.get(index)
            assert (stored.term, stored.kind, stored.body, stored.position) == (
                term,
                kind,
                body,
                position,
            ), index
            assert store.term_at(index) == term


EXAMPLES = int(os.environ.get("LOG_MODEL_EXAMPLES", "40"))  # raise it for a longer hunt
LogMatchesList.TestCase.settings = settings(
    max_examples=EXAMPLES, stateful_step_count=30, deadline=None
)
TestLogMatchesList = LogMatchesList.TestCase
