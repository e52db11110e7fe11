"""What the core is fed (events) and what it hands back (effects).

The caller's half of the contract, for every `Effects` returned by `RaftCore.step`, before
it feeds the next event:

1. send `send_now` (any time, any order; they promise nothing);
2. perform `persist` in field order: write `hard_state` durably (fsync) *first*, then `reset`,
   `truncate_after`, `append` to the log (written, not necessarily durable yet);
3. hold `send_after_persist` until the log is durable through `sync_through` (and the hard
   state of step 2 is durable); if a later truncation cuts below a held message's
   `sync_through`, drop that message (Raft resends; the ack would claim entries that are gone);
4. report durability back with `Persisted(through=EntryId(i, term_at(i)))` whenever the
   log's durable index advances;
5. apply committed entries up to `commit_index` (and no further than the log is durable).

A vote grant and an append ack are promises, which is why they are the only messages that
ride in `send_after_persist`.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence

import attrs

from dledger.raft.entries import EntryBatch, EntryId, LogStart, NodeId
from dledger.raft.membership import ChangeKind, ConfigEntry
from dledger.raft.messages import Envelope

# --- inputs ---------------------------------------------------------------------------------------


@attrs.frozen
class Tick:
    """One unit of the caller's clock (the node's TICK_MS; a simulator step)."""


@attrs.frozen
class Propose:
    payloads: Sequence[bytes]  # appended as consecutive DATA entries, all or none


@attrs.frozen
class TransferLeadership:
    target: NodeId


@attrs.frozen
class ChangeMembership:
    kind: ChangeKind
    node: NodeId


@attrs.frozen
class Persisted:
    """The log is durable through this entry. Stale reports (the entry was truncated since)
    are recognised by the term and ignored."""

    through: EntryId


@attrs.frozen
class PeerDisconnected:
    """The connection to a peer dropped (EOF, reset). A follower that loses its leader this way
    campaigns at once instead of waiting out an election timeout."""

    peer: NodeId


# --- outputs --------------------------------------------------------------------------------------


class Role(enum.Enum):
    FOLLOWER = "follower"
    PRE_CANDIDATE = "pre-candidate"
    CANDIDATE = "candidate"
    LEADER = "leader"


@attrs.frozen
class HardState:
    """What must survive a crash besides the log: the paper's currentTerm and votedFor, and
    the membership configurations from the last committed one on."""

    term: int = 0
    vote: NodeId | None = None
    configs: tuple[ConfigEntry, ...] = ()


@attrs.frozen
class Persist:
    hard_state: HardState | None = None  # durable before any log change below is made
    reset: LogStart | None = None  # drop the whole log; it restarts empty after reset.prev
    truncate_after: int | None = None  # drop entries after this index
    append: EntryBatch | None = None  # then append these


@attrs.frozen
class RoleState:
    role: Role
    term: int
    leader: NodeId | None


class Refusal(enum.Enum):
    NOT_LEADER = "not leader"
    TRANSFERRING = "leadership transfer in progress"
    BUSY = "too many uncommitted entries"
    CONFIG_PENDING = "a membership change is still uncommitted"
    BAD_REQUEST = "bad request"


@attrs.frozen
class Proposed:
    """A proposal got entries first..last of `term`; it is committed when the commit index
    reaches `last` while the entry there still has this term."""

    first: int
    last: int
    term: int


@attrs.frozen
class Refused:
    refusal: Refusal
    leader: NodeId | None  # where to retry, when known
    detail: str = ""


@attrs.frozen
class Accepted:
    """A leadership transfer started; its outcome shows as a role change."""

    target: NodeId


Result = Proposed | Refused | Accepted


@attrs.frozen
class Effects:
    send_now: tuple[Envelope, ...] = ()
    persist: Persist | None = None
    send_after_persist: tuple[Envelope, ...] = ()
    sync_through: int = 0  # send_after_persist waits until the log is durable through here
    commit_index: int | None = None  # advanced
    role: RoleState | None = None  # role, term or leader changed
    result: Result | None = None  # the answer to Propose, TransferLeadership or ChangeMembership
    notices: tuple[str, ...] = ()  # what an operator should read in the log (the node logs them)


NO_EFFECTS = Effects()

Event = Tick | Propose | TransferLeadership | ChangeMembership | Persisted | PeerDisconnected
