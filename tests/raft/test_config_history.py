"""ConfigHistory: the configuration entries a node holds, and what they answer."""

from __future__ import annotations

import pytest

from dledger.raft.config_history import ConfigHistory
from dledger.raft.entries import EntryBatch, EntryId, EntryKind, LogStart
from dledger.raft.events import Persist
from dledger.raft.membership import ConfigEntry, Membership
from dledger.raft.sim.memlog import MemLog


def members(*voters: str, learners: tuple[str, ...] = ()) -> Membership:
    return Membership(frozenset(voters), frozenset(learners))


ABC = members("a", "b", "c")
ABCD = members("a", "b", "c", "d")
AB = members("a", "b")
INITIAL = ConfigEntry(0, 0, ABC)


def history(*entries: ConfigEntry) -> ConfigHistory:
    return ConfigHistory([INITIAL, *entries])


def log_with_terms(terms: list[int]) -> MemLog:
    log = MemLog()
    n = len(terms)
    log.write(Persist(append=EntryBatch(1, terms, [EntryKind.DATA.value] * n, [b""] * n)))
    log.fsync()
    return log


class TestRecover:
    def test_keeps_entries_the_log_holds(self) -> None:
        """Entries whose (index, term) the log holds survive a restart."""
        log = log_with_terms([1, 1, 2, 2])
        entries = [INITIAL, ConfigEntry(2, 1, ABCD), ConfigEntry(4, 2, AB)]
        assert ConfigHistory.recover(entries, log, ABC).entries == entries

    def test_drops_entries_the_log_lost(self) -> None:
        """The hard state is written first: an entry past the log's end, or replaced by an
        entry of another term, was lost in the crash and never took effect."""
        log = log_with_terms([1, 1, 2])
        entries = [INITIAL, ConfigEntry(2, 2, ABCD), ConfigEntry(4, 2, AB)]
        assert ConfigHistory.recover(entries, log, ABC).entries == [INITIAL]

    def test_keeps_entries_before_the_log_start(self) -> None:
        """An entry the log no longer retains was committed there: it stays."""
        log = log_with_terms([1, 1, 2, 2])
        log.compact(3)
        entries = [ConfigEntry(2, 1, ABCD)]
        assert ConfigHistory.recover(entries, log, ABC).entries == entries

    def test_keeps_the_entry_at_a_reset_log_start(self) -> None:
        """After InstallLogStart the log starts right after the entry that carries it."""
        log = MemLog()
        log.write(Persist(reset=LogStart(EntryId(5, 2), 0)))
        entries = [ConfigEntry(5, 2, ABCD)]
        assert ConfigHistory.recover(entries, log, ABC).entries == entries

    def test_the_initial_membership_when_nothing_is_left(self) -> None:
        """A fresh node starts from the membership it was given, at index 0."""
        recovered = ConfigHistory.recover([], MemLog(), ABC)
        assert recovered.entries == [ConfigEntry(0, 0, ABC)]

    def test_never_empty(self) -> None:
        """A node always has a configuration."""
        with pytest.raises(AssertionError):
            ConfigHistory([])


class TestLookups:
    def test_latest_and_previous(self) -> None:
        """The latest rules (committed or not); the one before it is kept while it is there."""
        h = history(ConfigEntry(3, 1, ABCD))
        assert h.latest == ConfigEntry(3, 1, ABCD)
        assert h.previous == INITIAL
        assert history().previous is None
        assert len(h) == 2 and h.as_tuple() == (INITIAL, ConfigEntry(3, 1, ABCD))

    def test_at(self) -> None:
        """The configuration in effect at an index: the last one at or before it."""
        h = history(ConfigEntry(3, 1, ABCD), ConfigEntry(7, 2, AB))
        assert h.at(0) == INITIAL
        assert h.at(2) == INITIAL
        assert h.at(3).membership == ABCD
        assert h.at(6).membership == ABCD
        assert h.at(100).membership == AB

    def test_at_before_the_oldest_gives_the_oldest(self) -> None:
        """A collapsed history answers its oldest entry for anything older."""
        h = ConfigHistory([ConfigEntry(5, 1, ABCD)])
        assert h.at(2) == ConfigEntry(5, 1, ABCD)

    def test_is_newer_than_latest_compares_term_first(self) -> None:
        """A later term wins even at a lower index; in one term the higher index wins."""
        h = history(ConfigEntry(8, 2, ABCD))
        assert h.is_newer_than_latest(EntryId(5, 3))
        assert h.is_newer_than_latest(EntryId(9, 2))
        assert not h.is_newer_than_latest(EntryId(8, 2))
        assert not h.is_newer_than_latest(EntryId(20, 1))


class TestRemovalOf:
    REMOVAL = ConfigEntry(6, 3, AB)  # c removed at index 6 by an entry of term 3

    def test_a_node_whose_log_lacks_the_committed_removal(self) -> None:
        """Its log ends before the entry, or ends in an older term: the removal is the answer."""
        h = history(self.REMOVAL)
        assert h.removal_of("c", EntryId(5, 3), commit_index=6) == self.REMOVAL
        assert h.removal_of("c", EntryId(9, 2), commit_index=6) == self.REMOVAL
        assert h.removal_of("c", EntryId(4, 4), commit_index=9) == self.REMOVAL

    def test_a_log_that_may_hold_the_entry(self) -> None:
        """A log ending at or past the index in that term or later may hold it: no answer."""
        h = history(self.REMOVAL)
        assert h.removal_of("c", EntryId(6, 3), commit_index=6) is None
        assert h.removal_of("c", EntryId(7, 4), commit_index=9) is None

    def test_not_while_uncommitted(self) -> None:
        """An uncommitted removal may still be lost: no answer."""
        h = history(self.REMOVAL)
        assert h.removal_of("c", EntryId(1, 1), commit_index=5) is None

    def test_not_for_members(self) -> None:
        """A voter or learner of the latest configuration is never told it was removed."""
        h = history(ConfigEntry(6, 3, members("a", "b", learners=("c",))))
        assert h.removal_of("c", EntryId(1, 1), commit_index=6) is None
        assert h.removal_of("a", EntryId(1, 1), commit_index=6) is None

    def test_not_from_the_command_line_configuration(self) -> None:
        """Index 0 came from the command line, not the log: it proves nothing."""
        h = ConfigHistory([ConfigEntry(0, 0, AB)])
        assert h.removal_of("c", EntryId(0, 0), commit_index=10) is None


class TestChanges:
    def test_add_takes_effect_at_once(self) -> None:
        """An appended configuration is the latest, committed or not."""
        h = history()
        h.add(ConfigEntry(4, 2, ABCD))
        assert h.latest.membership == ABCD and h.previous == INITIAL

    def test_add_must_be_newer(self) -> None:
        """Entries come in log order."""
        h = history(ConfigEntry(4, 2, ABCD))
        with pytest.raises(AssertionError):
            h.add(ConfigEntry(4, 2, AB))

    def test_truncate_after_brings_the_older_one_back(self) -> None:
        """Cutting the entry off the log restores the configuration before it."""
        h = history(ConfigEntry(3, 1, ABCD), ConfigEntry(7, 2, AB))
        assert h.truncate_after(5)
        assert h.latest.membership == ABCD
        assert not h.truncate_after(3)  # the entry at 3 stays
        assert h.latest.membership == ABCD

    def test_reset_keeps_only_the_given_one(self) -> None:
        """A log restarted at a leader's start holds only the configuration in effect there."""
        h = history(ConfigEntry(3, 1, ABCD))
        h.reset(ConfigEntry(10, 4, AB))
        assert h.entries == [ConfigEntry(10, 4, AB)]

    def test_collapse_keeps_the_one_in_effect_at_the_horizon(self) -> None:
        """Older entries go; the one in effect at the horizon and newer ones stay."""
        h = history(ConfigEntry(3, 1, ABCD), ConfigEntry(7, 2, AB))
        h.collapse(2)
        assert len(h) == 3
        h.collapse(5)
        assert h.entries == [ConfigEntry(3, 1, ABCD), ConfigEntry(7, 2, AB)]
        h.collapse(100)
        assert h.entries == [ConfigEntry(7, 2, AB)]
