"""What a leader knows about one follower, and how much it may send it.

    PROBE ---- success ----> REPLICATE
      ^                          |
      +------ rejection ---------+        RESET (follower restarts its log at our start)
      ^                                       |
      +------ ack of InstallLogStart ---------+

PROBE: the leader does not know where the follower's log matches; one AppendEntries at a
time, retried on the next heartbeat reply. REPLICATE: the match point is known; batches are
sent back to back (pipelined) without waiting, up to `inflight_max` unacknowledged batches.
RESET: an InstallLogStart is outstanding, retried on the next heartbeat reply.
"""

from __future__ import annotations

import enum
from collections import deque

import attrs


class ProgressState(enum.Enum):
    PROBE = "probe"
    REPLICATE = "replicate"
    RESET = "reset"


@attrs.define
class Progress:
    match: int  # highest index known to match the leader's log (0: none known)
    next: int  # next index to send
    inflight_max: int
    state: ProgressState = ProgressState.PROBE
    paused: bool = False  # PROBE/RESET: a message is out; wait for its answer or a heartbeat reply
    recent_active: bool = True  # heard from since the last check-quorum round
    inflight: deque[int] = attrs.field(factory=deque)  # last index of each unacked batch

    def become_probe(self) -> None:
        self.state = ProgressState.PROBE
        self.paused = False
        self.next = self.match + 1
        self.inflight.clear()

    def become_replicate(self) -> None:
        self.state = ProgressState.REPLICATE
        self.paused = False
        self.next = self.match + 1
        self.inflight.clear()

    def become_reset(self) -> None:
        self.state = ProgressState.RESET
        self.paused = True
        self.inflight.clear()

    def can_send(self) -> bool:
        if self.state is ProgressState.REPLICATE:
            return len(self.inflight) < self.inflight_max
        return not self.paused

    def sent(self, last_index: int) -> None:
        """A batch ending at last_index (or a probe, when last_index < next) went out."""
        if self.state is ProgressState.REPLICATE:
            if last_index >= self.next:
                self.next = last_index + 1
                self.inflight.append(last_index)
        else:
            self.paused = True

    def acked(self, match_index: int) -> bool:
        """A success reply; returns whether the match point moved."""
        self.paused = False
        if match_index <= self.match:
            return False
        self.match = match_index
        self.next = max(self.next, match_index + 1)
        while self.inflight and self.inflight[0] <= match_index:
            self.inflight.popleft()
        return True

    def heartbeat_answered(self) -> None:
        """A heartbeat came back: a lost probe may be resent, and if every inflight batch's ack
        was lost the window opens one slot, so a lossy link cannot stall replication forever."""
        self.paused = False
        if self.state is ProgressState.REPLICATE and len(self.inflight) >= self.inflight_max:
            self.inflight.popleft()
