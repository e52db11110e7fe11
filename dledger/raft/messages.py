"""Messages between replicas: one class per message, named as in the Raft paper.

Every message carries the sender's term and the sender's id (under the paper's name for
that role); `sender` gives the id whatever the class. Messages are plain values; the wire
codec (dledger/wire.py) turns them into msgpack maps.
"""

from __future__ import annotations

import attrs

from dledger.raft.entries import EntryBatch, EntryId, LogStart, NodeId
from dledger.raft.membership import ConfigEntry


@attrs.frozen
class RequestVote:
    term: int  # for a pre-vote: the term the candidate would campaign in (its term + 1)
    candidate: NodeId
    last_log: EntryId  # (index, term) of the candidate's last entry
    pre_vote: bool  # a pre-vote changes nobody's term or vote
    transfer: bool = False  # sent after TimeoutNow: voters set their leader lease aside

    @property
    def sender(self) -> NodeId:
        return self.candidate


@attrs.frozen
class RequestVoteReply:
    term: int  # a granted pre-vote answers with the term it was asked about
    voter: NodeId
    granted: bool
    pre_vote: bool
    # A refusal because the candidate is outside the voter's newest configuration, which is
    # committed at this index (0: not that refusal) by an entry of this term. See
    # RaftCore._removal_of.
    removed_at: int = 0
    removed_term: int = 0

    @property
    def sender(self) -> NodeId:
        return self.voter


@attrs.frozen
class AppendEntries:
    term: int
    leader: NodeId
    prev: EntryId  # the entry just before `entries` in the leader's log
    entries: EntryBatch  # may be empty: a probe
    commit: int  # the leader's commit index

    @property
    def sender(self) -> NodeId:
        return self.leader


@attrs.frozen
class AppendEntriesReply:
    term: int
    follower: NodeId
    success: bool
    match_index: int  # on success: the follower's log matches the leader's through here
    reject_index: int = (
        0  # on failure: the prev.index that did not match (stale replies are ignored)
    )
    hint: EntryId | None = None  # on failure: the follower's conflicting term and that term's
    # first index, so the leader skips a whole term per round trip; (last_index + 1, 0) when the
    # follower's log is simply too short

    @property
    def sender(self) -> NodeId:
        return self.follower


@attrs.frozen
class Heartbeat:
    term: int
    leader: NodeId
    commit: int  # min(the follower's match index, the leader's commit index)

    @property
    def sender(self) -> NodeId:
        return self.leader


@attrs.frozen
class HeartbeatReply:
    term: int
    follower: NodeId
    log_end: int = 0  # the follower's last index: shorter than what it acknowledged means a
    # wiped store, which the leader could otherwise only notice when it next sends entries

    @property
    def sender(self) -> NodeId:
        return self.follower


@attrs.frozen
class TimeoutNow:
    """Leadership transfer: the target campaigns at once, without a pre-vote."""

    term: int
    leader: NodeId

    @property
    def sender(self) -> NodeId:
        return self.leader


@attrs.frozen
class InstallLogStart:
    """The follower needs entries the leader no longer retains: it drops its log and restarts
    it at the leader's first retained index, as DLedger does. Answered with AppendEntriesReply."""

    term: int
    leader: NodeId
    start: LogStart
    commit: int
    config: ConfigEntry  # the configuration in effect at start.prev, which the follower cannot read

    @property
    def sender(self) -> NodeId:
        return self.leader


Message = (
    RequestVote
    | RequestVoteReply
    | AppendEntries
    | AppendEntriesReply
    | Heartbeat
    | HeartbeatReply
    | TimeoutNow
    | InstallLogStart
)
MESSAGE_TYPES = (
    RequestVote,
    RequestVoteReply,
    AppendEntries,
    AppendEntriesReply,
    Heartbeat,
    HeartbeatReply,
    TimeoutNow,
    InstallLogStart,
)


@attrs.frozen
class Envelope:
    to: NodeId
    message: Message
