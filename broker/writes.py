"""Writes into the group's log from any replica: through the local node when it leads, else
forwarded to the leader as a dledger client append (its peer port), so a client holding a
stale route keeps working. While no leader exists a write waits within its deadline, then
fails as a 4.x slave would (SERVICE_NOT_AVAILABLE).

Every write is answered within its deadline, and sooner when waiting longer cannot help:
- a write proposed here as leader waits for its commit until the deadline, or until this
  replica has known no leader for LEADERLESS_WAIT_S (check-quorum deposed it: it is cut off
  from its peers, and nothing it proposed can commit before the partition heals). A leader
  that hands over to a known successor (a transfer, a higher term heard) keeps waiting: the
  successor's commit reaches it within milliseconds;
- a write forwarded to the leader is abandoned once this replica learns of another leader
  (the one it forwarded to was paused or cut off and replaced), or has known none for
  LEADERLESS_WAIT_S (it lost that leader too).
Both end as WriteUnknown: the entry may still commit, so the client is told the outcome is
unknown (the UNIQ_KEY dedupes a resend), never that it failed.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import math
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import attrs
import trio

from dledger.client import AppendFailed, ClientError, DLedgerClient, OutcomeUnknown
from dledger.node import AppendReply, Node
from dledger.wire import Status

log = logging.getLogger("broker.writes")

RETRY_SLEEP_S = 0.005  # a leader refusing while it catches up, or a transfer: ask again soon
RETRYABLE = frozenset({Status.BUSY, Status.TRANSFERRING, Status.NOT_LEADER, Status.SHUTTING_DOWN})
# A write proposed here is given up (outcome unknown) once this replica has known no leader for
# this long: it lost its quorum (check-quorum stepped it down) or the election after it is
# still going on, and its commit cannot come before a new leader reaches it. Longer than the
# gap between a leader stepping down for a higher term and hearing its successor, which takes
# one AppendEntries (milliseconds), so a leadership transfer still answers SEND_OK.
LEADERLESS_WAIT_S = 0.1

T = TypeVar("T")


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


@attrs.define(eq=False)
class _Waiter:
    """One write proposed here: woken by its answer, or by WritePath.run giving it up."""

    since: float  # when it was proposed (its deadline is in WritePath's heap)
    event: trio.Event = attrs.Factory(trio.Event)
    answer: AppendReply | None = None

    def reply(self, status: Status, message: str, fields: dict[str, Any]) -> None:
        self.answer = AppendReply(status, message, fields)
        self.event.set()


class WritePath:
    """Writes from this replica. `run` must be running (in the broker's nursery) while writes
    are made: it gives up the writes proposed here, one task for all of them, where a cancel
    scope per write cost a tenth of a saturated leader's CPU."""

    def __init__(self, node: Node, client: DLedgerClient) -> None:
        self.node = node
        self.client = client
        self.forwarded = 0
        self._waiters: set[_Waiter] = set()  # proposed here, not yet answered or given up
        # (deadline, sequence, waiter): answered ones stay until they reach the top
        self._deadlines: list[tuple[float, int, _Waiter]] = []
        self._sequence = itertools.count()
        self._rearm = trio.Event()
        self._armed_until = math.inf  # when run wakes next unless rearmed
        self._leaderless_since: float | None = None
        self._running = False
        node.on_role_change(self._role_changed)

    def _role_changed(self, _role: object) -> None:
        self._rearm.set()  # a lost leader starts the LEADERLESS_WAIT_S clock

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Give up each write proposed here at its deadline, or once this replica has known no
        leader for LEADERLESS_WAIT_S (since the write was proposed); until cancelled."""
        self._running = True
        task_status.started()
        try:
            while True:
                until = self._give_up_due(trio.current_time())
                self._armed_until = until
                with trio.move_on_at(until):
                    await self._rearm.wait()
                self._rearm = trio.Event()
        finally:
            self._running = False

    def _give_up_due(self, now: float) -> float:
        """Give up the writes that are due; when to look next."""
        deadlines, waiting = self._deadlines, self._waiters
        while deadlines and (deadlines[0][0] <= now or deadlines[0][2] not in waiting):
            _, _, waiter = heapq.heappop(deadlines)
            if waiter in waiting:
                self._give_up(waiter)
        until = deadlines[0][0] if deadlines else math.inf
        if self.node.leader is not None:
            self._leaderless_since = None
            return until
        if self._leaderless_since is None:
            self._leaderless_since = now
        for waiter in list(waiting):
            due = max(waiter.since, self._leaderless_since) + LEADERLESS_WAIT_S
            if due <= now:
                self._give_up(waiter)
            else:
                until = min(until, due)
        return until

    def _give_up(self, waiter: _Waiter) -> None:
        self._waiters.discard(waiter)
        waiter.event.set()  # with no answer: the write's outcome is unknown

    async def append(self, bodies: Sequence[bytes], timeout_s: float) -> Written:
        """Append `bodies` as consecutive entries (all or none) and return once committed."""
        deadline = trio.current_time() + timeout_s
        while True:
            node = self.node
            if node.accepting_appends:
                reply = await self._append_here(node, bodies, deadline)
                if reply is None:
                    raise WriteUnknown(self._why_given_up(deadline, "committed"))
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
            return await self._forward(bodies, deadline)

    async def _append_here(
        self, node: Node, bodies: Sequence[bytes], deadline: float
    ) -> AppendReply | None:
        """The answer of an append proposed here, or None once `run` gave it up (at the
        deadline, or once this replica has known no leader for LEADERLESS_WAIT_S)."""
        if not self._running:
            raise RuntimeError("WritePath.run is not running: nothing would give writes up")
        now = trio.current_time()
        waiter = _Waiter(now)
        node.submit_append(bodies, waiter.reply)
        self._waiters.add(waiter)
        heapq.heappush(self._deadlines, (deadline, next(self._sequence), waiter))
        if deadline < self._armed_until:
            self._rearm.set()
        try:
            await waiter.event.wait()
        finally:
            self._waiters.discard(waiter)
        return waiter.answer

    async def _forward(self, bodies: Sequence[bytes], deadline: float) -> Written:
        node = self.node
        leader = node.leader
        if leader is not None:
            self.client.follow(leader)  # the client's own guess may be an older leader
        self.forwarded += 1
        try:
            index = await self._until_given_up(
                self.client.append(list(bodies), timeout=deadline - trio.current_time()),
                deadline,
                lambda: self._forward_hopeless(leader),
            )
        except AppendFailed as err:
            raise WriteFailed(str(err)) from err
        except OutcomeUnknown as err:
            raise WriteUnknown(str(err)) from err
        except ClientError as err:
            raise WriteUnknown(str(err)) from err
        if index is None:
            raise WriteUnknown(self._why_given_up(deadline, f"answered by {leader}"))
        return Written(index, False)

    async def _until_given_up(
        self,
        waiting: Awaitable[T],
        deadline: float,
        give_up: Callable[[], Awaitable[None]],
    ) -> T | None:
        """What `waiting` returns, or None at the deadline or once `give_up` returns."""
        result: list[T] = []
        raised: list[Exception] = []
        async with trio.open_nursery() as nursery:

            async def wait() -> None:
                try:
                    result.append(await waiting)
                except Exception as err:  # raised below, outside the nursery (no group)
                    raised.append(err)
                nursery.cancel_scope.cancel()

            nursery.start_soon(wait)
            with trio.move_on_at(deadline):
                await give_up()
            nursery.cancel_scope.cancel()
        if raised:
            raise raised[0]
        return result[0] if result else None

    async def _leaderless_too_long(self) -> None:
        """Returns once this replica has known no leader for LEADERLESS_WAIT_S."""
        node = self.node
        while True:
            while node.leader is not None:
                await node.wait_role_change()
            with trio.move_on_after(LEADERLESS_WAIT_S):
                while node.leader is None:
                    await node.wait_role_change()
                continue
            return

    async def _forward_hopeless(self, leader: str | None) -> None:
        """Returns once this replica knows another leader than the one it forwarded to, or
        has known none for LEADERLESS_WAIT_S (it lost that leader and no successor reached
        it yet: the forward's answer is unlikely to come before the client gives up)."""
        async with trio.open_nursery() as nursery:

            async def first(wait: Callable[[], Awaitable[None]]) -> None:
                await wait()
                nursery.cancel_scope.cancel()

            nursery.start_soon(first, lambda: self._leader_replaced(leader))
            nursery.start_soon(first, self._leaderless_too_long)

    async def _leader_replaced(self, leader: str | None) -> None:
        """Returns once this replica knows a leader other than `leader`."""
        node = self.node
        while node.leader is None or node.leader == leader:
            await node.wait_role_change()

    def _why_given_up(self, deadline: float, waited_for: str) -> str:
        node = self.node
        if trio.current_time() >= deadline:
            return f"not {waited_for} before the write's deadline"
        if node.leader is None:
            return (
                f"not {waited_for}: {node.config.self_id} has known no leader for "
                f"{LEADERLESS_WAIT_S} s (term {node.term}); it may still commit"
            )
        return f"not {waited_for}: {node.leader} leads now (term {node.term}); it may still commit"
