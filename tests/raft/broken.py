"""Deliberately broken cores: each breaks one rule, and the simulator must notice.

A checker that never fires is not a checker; these prove ours can.
"""

from __future__ import annotations

import attrs

from dledger.raft.core import RaftCore
from dledger.raft.events import HardState
from dledger.raft.messages import Message, RequestVoteReply


class CommitsPreviousTerm(RaftCore):
    """Commits any entry a quorum holds, whatever its term (what Figure 8 shows is unsafe)."""

    def _can_commit(self, index: int) -> bool:
        return True


class ForgetsVote(RaftCore):
    """Persists its term but not whom it voted for, so a restart can vote twice in a term."""

    def hard_state(self) -> HardState:
        return attrs.evolve(super().hard_state(), vote=None)


class AcksBeforeDurable(RaftCore):
    """Sends vote grants and append acks before what they promise is on disk."""

    def _send_after_persist(self, to: str, message: Message, sync_through: int) -> None:
        self._send(to, message)


class SkipsVoteReplyTermCheck(RaftCore):
    """Counts every granted reply, of whatever term and of pre-votes as votes."""

    def _vote_reply_counts(self, m: RequestVoteReply) -> bool:
        return True


BROKEN_CORES = [CommitsPreviousTerm, ForgetsVote, AcksBeforeDurable, SkipsVoteReplyTermCheck]
