"""State that exists only while a node leads: created on election, dropped on stepping down,
so nothing a leader knows about its followers can leak into a later term."""

from __future__ import annotations

from collections import deque

import attrs

from dledger.raft.entries import NodeId
from dledger.raft.progress import Progress


@attrs.define
class LeaderState:
    progress: dict[NodeId, Progress]
    pending_config_index: int  # the last config entry in the log; no new change until committed
    transfer_target: NodeId | None = None
    transfer_elapsed: int = 0
    preferred_cooldown: int = 0  # ticks before handing over to the preferred leader again
    auto_promote: set[NodeId] = attrs.field(factory=set)  # learners added as future voters
    # (last index, payload bytes) of each uncommitted proposal, to bound the backlog
    uncommitted: deque[tuple[int, int]] = attrs.field(factory=deque)
    uncommitted_bytes: int = 0

    def add_uncommitted(self, last_index: int, nbytes: int) -> None:
        self.uncommitted.append((last_index, nbytes))
        self.uncommitted_bytes += nbytes

    def committed_through(self, index: int) -> None:
        while self.uncommitted and self.uncommitted[0][0] <= index:
            self.uncommitted_bytes -= self.uncommitted.popleft()[1]

    def start_transfer(self, target: NodeId) -> None:
        self.transfer_target = target
        self.transfer_elapsed = 0

    def stop_transfer(self) -> None:
        self.transfer_target = None
        self.transfer_elapsed = 0
