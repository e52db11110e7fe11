"""Membership: who votes, who only learns, how it changes, and the entry that carries it.

Changes go one server at a time (Raft dissertation, section 4.1): a configuration takes
effect on a server as soon as its entry is in that server's log, committed or not, and a
leader starts no new change until the previous one commits. A new server joins as a learner
(it receives entries but does not vote) and is promoted once it has caught up, so it never
slows commits while it copies the log. The configurations a node holds over time are kept
by `config_history.py`.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence

import attrs
import msgpack

from dledger.raft.entries import NodeId


@attrs.frozen
class Membership:
    voters: frozenset[NodeId]
    learners: frozenset[NodeId] = frozenset()

    def __attrs_post_init__(self) -> None:
        assert not (self.voters & self.learners), (self.voters, self.learners)

    @property
    def members(self) -> frozenset[NodeId]:
        return self.voters | self.learners

    @property
    def quorum(self) -> int:
        return len(self.voters) // 2 + 1

    def encode(self) -> bytes:
        """The body of a CONFIG entry (docs/formats.md)."""
        body = {"voters": sorted(self.voters), "learners": sorted(self.learners)}
        return bytes(msgpack.packb(body))

    @classmethod
    def decode(cls, body: bytes) -> Membership:
        d = msgpack.unpackb(body)
        return cls(frozenset(d["voters"]), frozenset(d.get("learners", ())))

    def __str__(self) -> str:
        learners = f" learners={sorted(self.learners)}" if self.learners else ""
        return f"voters={sorted(self.voters)}{learners}"


def majority_index(indexes: Iterable[int], quorum: int) -> int:
    """The highest index that at least `quorum` of the given match indexes reach."""
    ranked = sorted(indexes, reverse=True)
    assert 1 <= quorum <= len(ranked), (quorum, ranked)
    return ranked[quorum - 1]


class ChangeKind(enum.Enum):
    ADD_VOTER = "add-voter"  # joins as a learner; the leader promotes it once it has caught up
    ADD_LEARNER = "add-learner"  # stays a learner
    PROMOTE = "promote"  # a learner becomes a voter
    REMOVE = "remove"


class ChangeRefusal(enum.Enum):
    """Why a membership change cannot apply to the current membership."""

    ALREADY_MEMBER = "is already a member"  # ADD_VOTER, ADD_LEARNER
    NOT_LEARNER = "is not a learner"  # PROMOTE
    NOT_MEMBER = "is not a member"  # REMOVE
    ONLY_VOTER = "is the only voter"  # REMOVE: a group without voters could never elect


@attrs.frozen
class ChangeRefused:
    """`apply_change` refused: `str()` is the sentence a client gets, e.g. "n3 is not a member"."""

    reason: ChangeRefusal
    node: NodeId

    def __str__(self) -> str:
        return f"{self.node} {self.reason.value}"


def apply_change(current: Membership, kind: ChangeKind, node: NodeId) -> Membership | ChangeRefused:
    """The next membership, or why the change is refused."""
    if kind in (ChangeKind.ADD_VOTER, ChangeKind.ADD_LEARNER):
        if node in current.members:
            return ChangeRefused(ChangeRefusal.ALREADY_MEMBER, node)
        return Membership(current.voters, current.learners | {node})
    if kind is ChangeKind.PROMOTE:
        if node not in current.learners:
            return ChangeRefused(ChangeRefusal.NOT_LEARNER, node)
        return Membership(current.voters | {node}, current.learners - {node})
    assert kind is ChangeKind.REMOVE
    if node not in current.members:
        return ChangeRefused(ChangeRefusal.NOT_MEMBER, node)
    if current.voters == {node}:
        return ChangeRefused(ChangeRefusal.ONLY_VOTER, node)
    return Membership(current.voters - {node}, current.learners - {node})


@attrs.frozen
class ConfigEntry:
    """A configuration and the log entry that carries it (index 0: from the command line)."""

    index: int
    term: int
    membership: Membership

    def to_state(self) -> list[object]:
        m = self.membership
        return [self.index, self.term, sorted(m.voters), sorted(m.learners)]

    @classmethod
    def from_state(cls, row: Sequence[object]) -> ConfigEntry:
        index, term, voters, learners = row
        assert isinstance(index, int) and isinstance(term, int)
        assert isinstance(voters, list) and isinstance(learners, list)
        return cls(index, term, Membership(frozenset(voters), frozenset(learners)))
