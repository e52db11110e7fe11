"""The leader's checks of unresolved half messages (RocketMQ's TransactionalMessageCheckService).

While a replica leads, one `TransactionChecker` per term keeps the pending halves of the
applied progress (broker/transaction_progress.py) in a heap by when each is due:
`transactionTimeOut` after its store time for the first check (or the half's own
CHECK_IMMUNITY_TIME_IN_SECONDS, as RocketMQ's checkImmunityTime), `transactionCheckInterval`
after the last recorded check for the next ones. For the halves that are due it appends one
"txn_check" entry naming them and, once that is in the log, sends CHECK_TRANSACTION_STATE (39)
one-way to a live producer of each half's group (PGROUP; the producers this replica knows from
heartbeats, broker/clients.py), which answers with END_TRANSACTION (broker/end_transaction.py).
A half already checked `transactionCheckMax` times is discarded instead, with a log line and a
"txn_end" entry; so is a half whose record retention deleted first.

Counting the check in the log before sending it means a half is checked at most
transactionCheckMax times in all, whatever leaders come and go; a check that was recorded and
never sent (the leader died in between) counts anyway, as in RocketMQ, where the re-put half
carries the count. A check with no live producer to go to counts too (RocketMQ's). A new leader
starts from the applied progress, so it goes on with each half's count and spacing.
"""

from __future__ import annotations

import heapq
import logging
import random
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import attrs
import trio

from broker.clients import ClientRegistry
from broker.entries import encode_meta
from broker.leader_tasks import each_term_led
from broker.state import BrokerState
from broker.transaction_progress import HOW_DISCARD, HOW_GONE, HalfState, TransactionProgress
from broker.transactions import HALF_QUEUE_ID, HALF_TOPIC, Check, check_of
from dledger.log.errors import LogError
from dledger.node import Node
from dledger.wire import Status
from remoting import stored_message
from remoting.codes import RequestCode
from remoting.command import RemotingCommand
from remoting.errors import MessageFormatError, RemotingError

if TYPE_CHECKING:
    from broker.context import Broker

log = logging.getLogger("broker.transaction_check")

CHECKS_PER_PASS_MAX = 256  # halves checked or discarded by one append
IDLE_CHECK_S = 1.0  # with nothing due sooner, look again this often (new halves are fed then)
RETRY_S = 0.05  # after a refused append (the leader still applying, a transfer, ...)
CHECK_SEND_S = 1.0  # one check handed to one producer's connection

# Sends one check to a live producer of its group: the producer's client id, or None when the
# group has no live producer here.
CheckSender = Callable[[Check], Awaitable[str | None]]


def wall_ms() -> int:
    return int(time.time() * 1000)


@attrs.frozen
class CheckConfig:
    timeout_ms: int  # transactionTimeOut
    interval_ms: int  # transactionCheckInterval
    check_max: int  # transactionCheckMax


class TransactionChecker:
    """One leader term's checks."""

    def __init__(
        self,
        state: BrokerState,
        node: Node,
        config: CheckConfig,
        send_check: CheckSender,
        now_ms: Callable[[], int] = wall_ms,
    ) -> None:
        self._state = state
        self._node = node
        self._config = config
        self._send_check = send_check
        self._now_ms = now_ms
        self._heap: list[tuple[int, int]] = []  # (due ms, half offset), entries may be stale
        self._fed = 0  # pending halves below this offset are in the heap
        self._checked_at: dict[int, int] = {}  # checks this term proposed, not applied maybe
        self._ended: set[int] = set()  # discards this term proposed
        self.checks = 0  # checks recorded by this checker
        self.discarded = 0

    async def run(self, term: int) -> None:
        """Check until cancelled (the supervisor cancels at the end of `term`)."""
        state = self._state
        await state.wait_applied_term(term)  # every earlier term's resolution is applied now
        while not state.metadata_complete:  # rebuilt from a cut log: wait for its snapshot
            await state.wait_applied(state.applied_index + 1)
        progress = state.metadata.transactions
        for offset, half in progress.pending.items():
            self._heap.append((self._due(offset, half), offset))
        heapq.heapify(self._heap)
        self._fed = progress.end
        log.info(
            "checking %d pending half messages as the leader of term %d",
            len(progress.pending),
            term,
        )
        idle_s = min(IDLE_CHECK_S, self._config.timeout_ms / 1000)
        while True:
            now = self._now_ms()
            self._feed()
            checks, ends = self._take_due(now)
            if checks or ends:
                if not await self._propose(checks, ends, now):
                    for offset in [*checks, *(o for o, _ in ends)]:
                        heapq.heappush(self._heap, (now, offset))
                    await trio.sleep(RETRY_S)
                    continue
                await self._send(checks)
                continue
            wait_s = idle_s
            if self._heap:
                wait_s = min(wait_s, max(0.0, (self._heap[0][0] - now) / 1000))
            await trio.sleep(wait_s)

    # --- what is due ------------------------------------------------------------------------

    def _due(self, offset: int, half: HalfState) -> int:
        config = self._config
        if half.checks == 0:  # CHECK_IMMUNITY_TIME_IN_SECONDS, when the half has one, wins
            first_ms = config.timeout_ms if half.immunity_ms is None else half.immunity_ms
            due = half.store_ms + first_ms
        else:
            due = half.last_check_ms + config.interval_ms
        checked_at = self._checked_at.get(offset)
        if checked_at is not None:  # proposed by us; the progress may not show it yet
            due = max(due, checked_at + config.interval_ms)
        return due

    def _feed(self) -> None:
        """Put the halves applied since the last pass into the heap."""
        progress = self._state.metadata.transactions
        for offset in range(self._fed, progress.end):
            half = progress.pending.get(offset)
            if half is not None:
                heapq.heappush(self._heap, (self._due(offset, half), offset))
        self._fed = max(self._fed, progress.end)

    def _take_due(self, now: int) -> tuple[dict[int, int], list[tuple[int, str]]]:
        """The halves to check now (with the number of the check), and those to discard
        (with why)."""
        progress = self._state.metadata.transactions
        lo, _ = self._state.queue_range(HALF_TOPIC, HALF_QUEUE_ID)
        heap = self._heap
        checks: dict[int, int] = {}
        ends: list[tuple[int, str]] = []
        while heap and len(checks) + len(ends) < CHECKS_PER_PASS_MAX:
            due, offset = heap[0]
            half = progress.pending.get(offset)
            if half is None or offset in self._ended:  # resolved
                heapq.heappop(heap)
                self._checked_at.pop(offset, None)
                continue
            actual = self._due(offset, half)
            if actual != due:  # a check recorded since it was pushed
                heapq.heapreplace(heap, (actual, offset))
                continue
            if due > now:
                break
            heapq.heappop(heap)
            if offset < lo:
                ends.append((offset, HOW_GONE))
            elif half.checks >= self._config.check_max:
                ends.append((offset, HOW_DISCARD))
            else:
                checks[offset] = half.checks + 1
        return checks, ends

    # --- recording and sending ------------------------------------------------------------------

    async def _propose(self, checks: dict[int, int], ends: list[tuple[int, str]], now: int) -> bool:
        """Record the checks and discards in one append; False when the leader refused it."""
        bodies = []
        if checks:
            bodies.append(encode_meta(TransactionProgress.check_op(checks, now)))
        reasons = {offset: self._describe(offset) for offset, _ in ends}
        for offset, how in ends:
            bodies.append(encode_meta(TransactionProgress.end_op(offset, how)))
        reply = await self._node.append(bodies)
        if reply.status not in (Status.OK, Status.OUTCOME_UNKNOWN):
            log.info("checks refused (%s: %s); trying again", reply.status.name, reply.message)
            return False
        # OK, or unknown: in this leader's log, so committed unless the term ends (and with it
        # this checker); either way not to be proposed again in this term
        for offset in checks:
            self._checked_at[offset] = now
            heapq.heappush(self._heap, (now + self._config.interval_ms, offset))
        self.checks += len(checks)
        for offset, how in ends:
            self._ended.add(offset)
            self.discarded += 1
            if how == HOW_GONE:
                log.warning(
                    "half message %d of a transaction was deleted (retention) before its "
                    "commit or rollback: discarded",
                    offset,
                )
            else:
                log.warning(
                    "transaction %s discarded: no commit or rollback after %d checks",
                    reasons[offset],
                    self._config.check_max,
                )
        return True

    def _half(self, offset: int) -> stored_message.StoredMessage | None:
        units = self._state.units(HALF_TOPIC, HALF_QUEUE_ID, offset, 1)
        if not units:
            return None
        try:
            return stored_message.decode(self._state.record_at(units[0].physical_offset))
        except (LogError, MessageFormatError) as err:
            log.error("half message %d cannot be read: %s", offset, err)
            return None

    def _describe(self, offset: int) -> str:
        half = self._half(offset)
        if half is None:
            return f"(half {offset})"
        p = half.properties
        return (
            f"{p.get('UNIQ_KEY', '?')} of producer group {p.get('PGROUP', '?')} to "
            f"{p.get('REAL_TOPIC', '?')} (half {offset})"
        )

    async def _send(self, numbers: dict[int, int]) -> None:
        """A check of each half to a live producer of its group, all at once; `numbers` maps
        each half to the number of its check."""
        async with trio.open_nursery() as nursery:
            for offset, number in numbers.items():
                half = self._half(offset)
                check = check_of(half) if half is not None else None
                if check is None:
                    log.error("half message %d is no readable half: not checked", offset)
                    continue
                nursery.start_soon(self._send_one, check, number)

    async def _send_one(self, check: Check, number: int) -> None:
        producer = await self._send_check(check)
        if producer is None:
            log.warning(
                "transaction %s: no live producer of group %s to check it with (check %d of %d)",
                check.uniq_key,
                check.producer_group,
                number,
                self._config.check_max,
            )
        else:
            log.info(
                "transaction %s: checking with producer %s of group %s (check %d of %d)",
                check.uniq_key,
                producer,
                check.producer_group,
                number,
                self._config.check_max,
            )


def producer_sender(clients: ClientRegistry) -> CheckSender:
    """Checks go to one live producer of the half's group, picked at random (RocketMQ's
    getAvailableChannel), then to the next if handing it over fails."""

    async def send(check: Check) -> str | None:
        members = [
            m
            for m in clients.producers.get(check.producer_group, {}).values()
            if not m.connection.closed
        ]
        random.shuffle(members)
        fields = check.header.encode()
        for member in members:
            request = RemotingCommand.request(
                RequestCode.CHECK_TRANSACTION_STATE, fields, check.body, oneway=True
            )
            try:
                with trio.fail_after(CHECK_SEND_S):
                    await member.connection.send_oneway(request)
            except (RemotingError, trio.TooSlowError) as err:
                log.debug("check to %s failed: %s", member.client_id, err)
                continue
            return member.client_id
        return None

    return send


async def supervise(
    node: Node,
    state: BrokerState,
    config: CheckConfig,
    send_check: CheckSender,
    now_ms: Callable[[], int] = wall_ms,
) -> None:
    """Run a TransactionChecker for each term this replica leads, cancelled when it ends."""

    async def run(term: int) -> None:
        await TransactionChecker(state, node, config, send_check, now_ms).run(term)

    await each_term_led(node, run)


async def run_checks(broker: Broker) -> None:
    """The broker's checks of half messages (started beside the node)."""
    config = broker.config
    checks = CheckConfig(
        config.transaction_timeout_ms,
        config.transaction_check_interval_ms,
        config.transaction_check_max,
    )
    await supervise(broker.node, broker.state, checks, producer_sender(broker.clients))
