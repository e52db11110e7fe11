"""The core's tunables, in ticks and bytes; the node maps ticks to milliseconds."""

from __future__ import annotations

import attrs

from dledger import limits
from dledger.raft.entries import NodeId


def _positive(_: object, attribute: attrs.Attribute[int], value: int) -> None:
    if value < 1:
        raise ValueError(f"{attribute.name} must be >= 1, got {value}")


@attrs.frozen
class RaftConfig:
    heartbeat_ticks: int = attrs.field(default=limits.HEARTBEAT_TICKS_DEFAULT, validator=_positive)
    election_ticks_min: int = attrs.field(
        default=limits.ELECTION_TICKS_MIN_DEFAULT, validator=_positive
    )
    election_ticks_max: int = attrs.field(
        default=limits.ELECTION_TICKS_MAX_DEFAULT, validator=_positive
    )
    pre_vote: bool = True
    check_quorum: bool = True
    preferred_leader: NodeId | None = None
    append_batch_bytes_max: int = attrs.field(
        default=limits.APPEND_BATCH_BYTES_MAX, validator=_positive
    )
    append_batch_entries_max: int = attrs.field(
        default=limits.APPEND_BATCH_ENTRIES_MAX, validator=_positive
    )
    inflight_max: int = attrs.field(default=limits.APPEND_INFLIGHT_MAX, validator=_positive)
    uncommitted_bytes_max: int = attrs.field(
        default=limits.UNCOMMITTED_BYTES_MAX, validator=_positive
    )
    leader_lost_stagger_ticks: int = limits.LEADER_LOST_STAGGER_TICKS
    prevote_retry_ticks: int = attrs.field(default=limits.PREVOTE_RETRY_TICKS, validator=_positive)
    transfer_ticks_max: int = attrs.field(default=limits.TRANSFER_TICKS_MAX, validator=_positive)

    def __attrs_post_init__(self) -> None:
        if self.election_ticks_min <= 2 * self.heartbeat_ticks:
            raise ValueError(
                f"election_ticks_min ({self.election_ticks_min}) must exceed two heartbeats "
                f"({2 * self.heartbeat_ticks}), or one lost heartbeat starts an election"
            )
        if self.election_ticks_max <= self.election_ticks_min:
            raise ValueError(
                f"election_ticks_max ({self.election_ticks_max}) must exceed election_ticks_min "
                f"({self.election_ticks_min}) so that timeouts are randomised"
            )
        if self.leader_lost_stagger_ticks < 0:
            raise ValueError("leader_lost_stagger_ticks must be >= 0")
