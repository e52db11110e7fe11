"""Writes into the group's log from any replica: through the local node when it leads, else
forwarded to the leader as a dledger client append (its peer port), so a client holding a
stale route keeps working. While no leader exists a write waits within its deadline, then
fails as a 4.x slave would (SERVICE_NOT_AVAILABLE).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import attrs
import trio

from dledger.client import AppendFailed, ClientError, DLedgerClient, OutcomeUnknown
from dledger.node import Node
from dledger.wire import Status

log = logging.getLogger("broker.writes")

RETRY_SLEEP_S = 0.005  # a leader refusing while it catches up, or a transfer: ask again soon
RETRYABLE = frozenset({Status.BUSY, Status.TRANSFERRING, Status.NOT_LEADER, Status.SHUTTING_DOWN})


@attrs.define
class WriteFailed(Exception):
    """Surely not written."""

    reason: str

    def __str__(self) -> str:
        return self.reason


@attrs.define
class WriteUnknown(Exception):
    """May or may not have been written (it may still commit)."""

    reason: str

    def __str__(self) -> str:
        return self.reason


@attrs.frozen
class Written:
    last_index: int
    through_leader: bool  # False: forwarded to another replica


class WritePath:
    def __init__(self, node: Node, client: DLedgerClient) -> None:
        self.node = node
        self.client = client
        self.forwarded = 0

    async def append(self, bodies: Sequence[bytes], timeout_s: float) -> Written:
        """Append `bodies` as consecutive entries (all or none) and return once committed."""
        deadline = trio.current_time() + timeout_s
        while True:
            node = self.node
            if node.accepting_appends:
                reply = await node.append(bodies)
                if reply.status is Status.OK:
                    return Written(reply.last_index, True)
                if reply.status is Status.OUTCOME_UNKNOWN:
                    raise WriteUnknown(reply.message)
                if reply.status not in RETRYABLE:
                    raise WriteFailed(f"{reply.status.name}: {reply.message}")
                if trio.current_time() + RETRY_SLEEP_S >= deadline:
                    raise WriteFailed(f"no leader accepted the write in time ({reply.message})")
                await trio.sleep(RETRY_SLEEP_S)
                continue
            if node.leader is None and trio.current_time() < deadline:
                # no leader known here: wait for the election instead of asking around
                with trio.move_on_at(deadline):
                    await node.wait_role_change()
                continue
            remaining = deadline - trio.current_time()
            if remaining <= 0:
                raise WriteFailed("no leader elected within the timeout")
            self.forwarded += 1
            try:
                index = await self.client.append(list(bodies), timeout=remaining)
            except AppendFailed as err:
                raise WriteFailed(str(err)) from err
            except OutcomeUnknown as err:
                raise WriteUnknown(str(err)) from err
            except ClientError as err:
                raise WriteUnknown(str(err)) from err
            return Written(index, False)
