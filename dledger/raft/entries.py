"""Log entries as the core, the log store and the wire see them.

A batch keeps its entries as parallel lists (terms, kinds, payloads) rather than one object
per entry: the leader builds a whole proposal with three list operations, the wire encodes
three lists in C, and the log store walks them once. Per-entry Python objects are what made
earlier designs slow (see docs/decisions.md).
"""

from __future__ import annotations

import enum
from collections.abc import Sequence

import attrs

NodeId = str


class EntryKind(enum.IntEnum):
    """What an entry's body means; stored in every entry header (docs/formats.md)."""

    DATA = 0  # a payload for the state machine above (the broker's stored message)
    NOOP = 1  # appended by every new leader so that entries of its term can commit
    CONFIG = 2  # a membership configuration, body = msgpack {"voters": [...], "learners": [...]}


@attrs.frozen(order=True)
class EntryId:
    """An entry's (index, term); index 0 with term 0 is the empty log's sentinel."""

    index: int
    term: int

    def __str__(self) -> str:
        return f"i{self.index}/t{self.term}"


@attrs.frozen
class LogStart:
    """Where a log begins when older entries are gone (retention, or a follower restarted
    from the leader's first retained index).

    `prev` is the entry just before the first retained one, which the log no longer holds
    but whose term Raft still needs for the log-matching check; `position` is the byte
    position the first retained entry has in the replicated log, so every replica keeps
    identical positions (RocketMQ's physical offsets). The core treats it as opaque.
    """

    prev: EntryId
    position: int


LOG_START_EMPTY = LogStart(prev=EntryId(0, 0), position=0)


@attrs.frozen
class EntryBatch:
    """Consecutive entries first_index, first_index+1, ...; the three lists are equally long."""

    first_index: int
    terms: Sequence[int]
    kinds: Sequence[int]
    payloads: Sequence[bytes]

    def __attrs_post_init__(self) -> None:
        assert self.first_index >= 1, self.first_index
        assert len(self.terms) == len(self.kinds) == len(self.payloads), (
            len(self.terms),
            len(self.kinds),
            len(self.payloads),
        )

    def __len__(self) -> int:
        return len(self.terms)

    @property
    def last_index(self) -> int:
        """Index of the last entry; first_index - 1 when the batch is empty."""
        return self.first_index + len(self.terms) - 1

    @property
    def last_term(self) -> int:
        assert self.terms, "empty batch has no last term"
        return self.terms[-1]

    def term_at(self, index: int) -> int:
        assert self.first_index <= index <= self.last_index, (index, self.first_index)
        return self.terms[index - self.first_index]

    def payload_bytes(self) -> int:
        return sum(map(len, self.payloads))

    def slice(self, lo: int, hi: int) -> EntryBatch:
        """Entries lo..hi inclusive (clamped to the batch)."""
        lo = max(lo, self.first_index)
        hi = min(hi, self.last_index)
        a, b = lo - self.first_index, hi - self.first_index + 1
        if b <= a:
            return EntryBatch(lo, [], [], [])
        return EntryBatch(lo, self.terms[a:b], self.kinds[a:b], self.payloads[a:b])


def empty_batch(first_index: int) -> EntryBatch:
    return EntryBatch(first_index, [], [], [])


def data_batch(first_index: int, term: int, payloads: Sequence[bytes]) -> EntryBatch:
    """A proposal: every entry a DATA entry of one term (three C-level list builds)."""
    n = len(payloads)
    return EntryBatch(first_index, [term] * n, [EntryKind.DATA.value] * n, list(payloads))
