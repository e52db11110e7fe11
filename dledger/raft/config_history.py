"""The history of configuration entries a node holds, oldest first.

A configuration takes effect as soon as its entry is in the log (Raft dissertation, section
4.1), so the newest entry rules even before it commits, and a truncation that cuts it off
brings the one before it back. The history is kept from the configuration in effect at the
log start on: a leader sends that one with `InstallLogStart` (the follower cannot read the
entry that carried it), and an uncommitted newest configuration needs the one before it
(`RaftCore._electorate`). The history is part of the hard state, so it survives restarts
even when the log start has moved past the entries that carried it.

This module holds the history and answers questions about it. When it changes is the core's
business: the core calls `add`, `truncate_after` and `reset` as it changes the log, and
`collapse` as the commit index and the log start advance.
"""

from __future__ import annotations

from collections.abc import Sequence

from dledger.raft.entries import EntryId, NodeId
from dledger.raft.membership import ConfigEntry, Membership
from dledger.raft.storage import RaftLog


class ConfigHistory:
    def __init__(self, entries: Sequence[ConfigEntry]) -> None:
        self._set(list(entries))

    def _set(self, entries: list[ConfigEntry]) -> None:
        """Every change goes through here, which keeps `latest` in step with `entries`."""
        assert entries, "a node always has a configuration"
        self.entries = entries  # oldest first; read only outside this class
        # The configuration in effect: the newest one in the log, committed or not. An
        # attribute rather than a property: the core reads it on every commit.
        self.latest = entries[-1]

    @classmethod
    def recover(
        cls, entries: Sequence[ConfigEntry], log: RaftLog, initial: Membership
    ) -> ConfigHistory:
        """The history from the hard state, minus any entry the log lost in a crash (the hard
        state is written before the log, so it may name entries the log never got); the
        `initial` membership (index 0: from the command line) when nothing is left."""
        start, last = log.start.prev.index, log.last_index
        kept = [
            c
            for c in entries
            if c.index <= start or (c.index <= last and log.term_at(c.index) == c.term)
        ]
        return cls(kept or [ConfigEntry(0, 0, initial)])

    # --- reading ----------------------------------------------------------------------------

    @property
    def previous(self) -> ConfigEntry | None:
        """The configuration before the latest, if the history still holds it."""
        return self.entries[-2] if len(self.entries) > 1 else None

    def __len__(self) -> int:
        return len(self.entries)

    def as_tuple(self) -> tuple[ConfigEntry, ...]:
        """For the hard state."""
        return tuple(self.entries)

    def at(self, index: int) -> ConfigEntry:
        """The configuration in effect at `index` (the oldest held when `index` precedes it)."""
        for config in reversed(self.entries):
            if config.index <= index:
                return config
        return self.entries[0]

    def removal_of(self, node: NodeId, last: EntryId, commit_index: int) -> ConfigEntry | None:
        """The latest configuration if it is committed, leaves `node` out, and a log ending at
        `last` does not hold the entry that carries it; else None.

        A log lacks the entry when it ends before its index, or ends in an older term than the
        entry's: terms never fall along a log, so its entry at that index is another one. A log
        that ends at or past the index in the entry's term or later may hold it. (Why a voter
        refuses such a node a vote: `RaftCore._removal_of`.)"""
        latest = self.latest
        committed = 0 < latest.index <= commit_index
        if not committed or node in latest.membership.members:
            return None
        lacks_it = last.index < latest.index or last.term < latest.term
        return latest if lacks_it else None

    def is_newer_than_latest(self, entry: EntryId) -> bool:
        """`entry` carries a configuration newer than our latest: by term first, then index. A
        configuration of ours past that index but of an older term came from a leader that
        never committed it (committed entries are in every later leader's log)."""
        latest = self.latest
        return (entry.term, entry.index) > (latest.term, latest.index)

    # --- changing ---------------------------------------------------------------------------

    def add(self, config: ConfigEntry) -> None:
        """A configuration entry was appended to the log: it takes effect now."""
        assert config.index > self.latest.index, (config, self.latest)
        self._set([*self.entries, config])

    def truncate_after(self, index: int) -> bool:
        """The log was cut after `index`: forget configurations it carried there. True when
        the history changed."""
        if self.latest.index <= index:
            return False
        self._set([c for c in self.entries if c.index <= index])
        return True

    def reset(self, config: ConfigEntry) -> None:
        """The log restarts at a leader's log start: `config` is the one in effect there."""
        self._set([config])

    def collapse(self, horizon: int) -> None:
        """Forget configurations older than the one in effect at `horizon` (the lower of the
        commit index and the log start): nobody can ask for them."""
        keep = 0
        for i, config in enumerate(self.entries):
            if config.index <= horizon:
                keep = i
        if keep:
            self._set(self.entries[keep:])
