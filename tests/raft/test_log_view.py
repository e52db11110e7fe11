"""LogView: the stored log plus one step's pending reset, truncation and appends."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dledger.raft.entries import EntryBatch, EntryId, EntryKind, LogStart
from dledger.raft.events import Persist
from dledger.raft.log_view import LogView
from dledger.raft.sim.memlog import MemLog

BIG = 1 << 30


def batch(first: int, terms: list[int]) -> EntryBatch:
    n = len(terms)
    payloads = [f"{first + i}/{t}".encode() for i, t in enumerate(terms)]
    return EntryBatch(first, list(terms), [EntryKind.DATA.value] * n, payloads)


def stored(terms: list[int]) -> MemLog:
    log = MemLog()
    if terms:
        log.write(Persist(append=batch(1, terms)))
        log.fsync()
    return log


def read_all(view: LogView, lo: int, hi: int) -> list[int]:
    return list(view.read(lo, hi, entries_max=BIG, bytes_max=BIG).terms)


def read_through(view: LogView, lo: int, hi: int) -> list[tuple[int, bytes]]:
    """Every entry lo..hi, in as many reads as it takes (as a leader sends them)."""
    out: list[tuple[int, bytes]] = []
    while lo <= hi:
        got = view.read(lo, hi, entries_max=BIG, bytes_max=BIG)
        assert got.first_index == lo and len(got), (lo, hi)
        out += zip(got.terms, got.payloads, strict=True)
        lo = got.last_index + 1
    return out


class TestNothingPending:
    def test_reads_the_store(self) -> None:
        """Without pending changes the view answers exactly what the store does."""
        view = LogView(stored([1, 1, 2]))
        assert view.start() == MemLog().start
        assert view.last_index() == 3
        assert [view.term_at(i) for i in range(0, 4)] == [0, 1, 1, 2]
        assert view.last_id() == EntryId(3, 2)
        assert not view.has_changes()

    def test_follows_a_store_compacted_between_steps(self) -> None:
        """The view holds no copy of the store: a compaction between steps shows at once."""
        log = stored([1, 1, 2, 2])
        view = LogView(log)
        log.compact(2)
        assert view.start().prev == EntryId(2, 1)
        assert view.first_index_of_term(2, 4) == 3


class TestAppend:
    def test_pending_entries_are_visible(self) -> None:
        """Entries appended in this step are read back before the caller writes them."""
        view = LogView(stored([1, 1]))
        view.append(batch(3, [2, 2]))
        assert view.last_index() == 4
        assert view.term_at(2) == 1 and view.term_at(4) == 2
        assert view.last_id() == EntryId(4, 2)
        assert view.has_changes()

    def test_consecutive_appends_merge_into_one_batch(self) -> None:
        """Two appends in one step become one pending batch, in order."""
        view = LogView(stored([1]))
        view.append(batch(2, [1]))
        view.append(batch(3, [2, 2]))
        pending = view.pending_append
        assert pending is not None
        assert (pending.first_index, list(pending.terms)) == (2, [1, 2, 2])
        assert list(pending.payloads) == [b"2/1", b"3/2", b"4/2"]

    def test_append_must_follow_the_last_entry(self) -> None:
        """A gap or an overlap is a bug in the caller."""
        view = LogView(stored([1, 1]))
        with pytest.raises(AssertionError):
            view.append(batch(4, [1]))
        with pytest.raises(AssertionError):
            view.append(batch(2, [1]))

    def test_clear_forgets_pending_changes(self) -> None:
        """A new step starts from the store alone."""
        view = LogView(stored([1]))
        view.truncate_after(0)
        view.append(batch(1, [3]))
        view.clear()
        assert not view.has_changes()
        assert view.last_id() == EntryId(1, 1)


class TestTruncateAfter:
    def test_hides_the_suffix(self) -> None:
        """After a pending truncation the log ends there; appends continue from it."""
        view = LogView(stored([1, 1, 1, 1]))
        view.truncate_after(2)
        assert view.last_index() == 2
        view.append(batch(3, [2]))
        assert view.last_id() == EntryId(3, 2)
        assert read_all(view, 1, 3) == [1, 1]  # a read stops where the pending entries begin
        assert read_all(view, 3, 3) == [2]

    def test_reading_a_truncated_entry_is_a_bug(self) -> None:
        """term_at past the truncation point asserts rather than answer from the store."""
        view = LogView(stored([1, 1, 1]))
        view.truncate_after(1)
        with pytest.raises(AssertionError):
            view.term_at(2)

    def test_only_before_appends(self) -> None:
        """A Persist truncates before it appends, so a truncation after an append is a bug."""
        view = LogView(stored([1]))
        view.append(batch(2, [1]))
        with pytest.raises(AssertionError):
            view.truncate_after(1)


class TestReset:
    def test_the_log_restarts_after_the_new_start(self) -> None:
        """A reset log is empty after start.prev, whose term it still knows."""
        view = LogView(stored([1, 1]))
        start = LogStart(EntryId(10, 3), 4096)
        view.reset(start)
        assert view.start() == start
        assert view.last_id() == EntryId(10, 3)
        view.append(batch(11, [3]))
        assert view.last_id() == EntryId(11, 3)

    def test_only_first_in_a_step(self) -> None:
        """A reset after a truncation or an append is a bug."""
        view = LogView(stored([1]))
        view.truncate_after(0)
        with pytest.raises(AssertionError):
            view.reset(LogStart(EntryId(5, 1), 0))


class TestRead:
    def test_bounded_by_entries_max(self) -> None:
        """At most entries_max entries, from the store or from the pending batch."""
        view = LogView(stored([1] * 5))
        view.append(batch(6, [2] * 5))
        assert len(view.read(1, 10, entries_max=3, bytes_max=BIG)) == 3
        assert view.read(7, 10, entries_max=2, bytes_max=BIG).first_index == 7
        assert len(view.read(7, 10, entries_max=2, bytes_max=BIG)) == 2

    def test_bounded_by_bytes_max_in_the_store(self) -> None:
        """The store stops once bytes_max is reached, but returns at least one entry."""
        view = LogView(stored([1] * 5))  # payloads "i/1": 3 bytes each
        assert len(view.read(1, 5, entries_max=BIG, bytes_max=7)) == 2
        assert len(view.read(1, 5, entries_max=BIG, bytes_max=1)) == 1


class TestSearches:
    TERMS = [1, 1, 3, 3, 3, 5]

    def test_first_index_of_term(self) -> None:
        """The first index of a term, searching (log start, hi]."""
        view = LogView(stored(self.TERMS))
        assert view.first_index_of_term(1, 2) == 1
        assert view.first_index_of_term(3, 5) == 3
        assert view.first_index_of_term(5, 6) == 6

    def test_last_index_with_term_at_most(self) -> None:
        """The last index whose term is <= the given one, or the log start when none is."""
        view = LogView(stored(self.TERMS))
        assert view.last_index_with_term_at_most(0, 6) == 0
        assert view.last_index_with_term_at_most(2, 6) == 2
        assert view.last_index_with_term_at_most(4, 6) == 5
        assert view.last_index_with_term_at_most(9, 4) == 4

    def test_searches_see_pending_entries(self) -> None:
        """Both searches run over the store and the pending append alike."""
        view = LogView(stored([1, 1]))
        view.append(batch(3, [4, 4]))
        assert view.first_index_of_term(4, 4) == 3
        assert view.last_index_with_term_at_most(3, 4) == 2


terms_strategy = st.lists(st.integers(0, 2), max_size=12).map(
    lambda steps: [1 + sum(steps[: i + 1]) for i in range(len(steps))]
)


@given(
    stored_terms=terms_strategy,
    change=st.sampled_from(["none", "truncate", "reset"]),
    cut=st.integers(0, 12),
    appended=st.lists(st.integers(0, 2), max_size=8),
)
def test_the_view_shows_what_the_store_holds_once_the_persist_is_performed(
    stored_terms: list[int], change: str, cut: int, appended: list[int]
) -> None:
    """Whatever one step changes, the view before the write agrees with the store after it."""
    log = stored(stored_terms)
    view = LogView(log)
    if change == "truncate":
        view.truncate_after(min(cut, log.last_index))
    elif change == "reset":
        view.reset(LogStart(EntryId(cut + 1, 99), 0))
    last = view.last_id()
    terms, term = [], max(last.term, 1)
    for step in appended:
        term += step
        terms.append(term)
    if terms:
        view.append(batch(last.index + 1, terms))
    seen_start, seen_last = view.start(), view.last_index()
    seen_terms = [view.term_at(i) for i in range(seen_start.prev.index, seen_last + 1)]
    first = seen_start.prev.index + 1
    seen_entries = read_through(view, first, seen_last)
    log.write(Persist(None, view.pending_reset, view.pending_truncate, view.pending_append))
    assert (log.start, log.last_index) == (seen_start, seen_last)
    assert [log.term_at(i) for i in range(log.start.prev.index, log.last_index + 1)] == seen_terms
    assert read_through(LogView(log), first, seen_last) == seen_entries
