"""`Node`: the Raft core, the disk log and the peer links, driven by trio.

The node is the one place where effects become I/O, always in the order the core's contract
asks (dledger/raft/events.py): send, write the hard state durably, change the log, hold
promises until the log is durable, report durability back, apply. One task, the raft loop,
steps the core; everything else (peer and client connections, the ticker, the flusher) hands
it events through a bounded inbox, so steps never interleave and the only await inside one is
the rare hard-state fsync.

Tasks, all in the nursery `run` opens: the raft loop, the ticker, the flusher (group commit,
dledger/log/flusher.py), the applier, the peer links (transport.py) and a maintenance loop
(checkpoint, retention, expired appends). The node listens on nothing: whoever embeds it hands
it inbound peer messages (`deliver`, `peer_disconnected`), as dledger/service.py does for
connections accepted by dledger/hosting.py, and its outbound links connect through an
injectable connector, so tests can run whole groups on memory streams.
"""

from __future__ import annotations

import contextlib
import logging
import math
import random
import zlib
from array import array
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime
from itertools import accumulate
from typing import Any, Protocol

import attrs
import trio

from dledger import limits
from dledger.appends import AppendWaiters, PendingAppend, Waiter
from dledger.config import NodeConfig
from dledger.log.entry import BLANK_BYTES_MIN, WITH_HEADER
from dledger.log.flusher import Flusher
from dledger.log.layout import StorePaths
from dledger.log.reader import StoredEntry
from dledger.log.segment import entry_position
from dledger.log.state_file import HARDSTATE_MAGIC, read_state_file, write_state_file
from dledger.log.store import FlushPolicy, LogStore
from dledger.raft.core import RaftCore
from dledger.raft.entries import EntryBatch, EntryId
from dledger.raft.events import (
    Effects,
    Event,
    HardState,
    PeerDisconnected,
    Persisted,
    Propose,
    Proposed,
    Refused,
    Result,
    Role,
    RoleState,
    Tick,
)
from dledger.raft.membership import ConfigEntry, Membership
from dledger.raft.messages import Message
from dledger.raft.promises import Promises
from dledger.transport import PeerConnector, PeerLinks
from dledger.wire import REFUSAL_STATUS, Status

log = logging.getLogger("dledger.node")


# Runs a blocking call off the event loop and returns its result (trio.to_thread.run_sync).
Offload = Callable[..., Awaitable[Any]]


class StateMachine(Protocol):
    """What the broker plugs in: committed entries, in order, exactly once per run (after a
    restart, from the checkpoint's applied index on, or from the state machine's own
    `applied_index` attribute when it has one and it is lower). One that sets `reads_bodies =
    False` is handed batches whose payloads are empty, and saves the node reading them back."""

    def apply(self, batch: EntryBatch) -> None: ...


class LogTrimmedListener(Protocol):
    """Optional, as a state machine's `log_trimmed` method: called with the byte position of
    the log's new first entry after retention deleted its head, or after a follower's log
    restarted at the leader's first retained entry, so files derived from the log (the
    broker's ConsumeQueues) can let go of what they point at below it."""

    def __call__(self, first_position: int) -> None: ...


class ProposalRefused(Exception):
    """A shaper's refusal of a proposal: every append in it is answered with this."""

    def __init__(self, status: Status, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class ProposalShaper(Protocol):
    """Optional, as a state machine's `shaper` attribute: sees every proposal on the leader
    just before it enters the log, with the index and byte position each entry will have,
    and may rewrite payload bytes in place of the same length (RocketMQ's queue offset and
    physical offset are written into each message here, so they are the same on every
    replica). Raising ProposalRefused refuses the whole proposal (e.g. not ready after an
    election); `refused()` says the core refused the proposal just shaped."""

    def shape(
        self, first_index: int, positions: Sequence[int], payloads: list[bytes]
    ) -> list[bytes]: ...

    def refused(self) -> None: ...


class NullStateMachine:
    """dledger-server's: the log is the state."""

    reads_bodies = False

    def apply(self, batch: EntryBatch) -> None:
        pass


class AppliedDigest:
    """A fingerprint of what this run applied: CRC-32 streams over the terms, kinds and sizes of
    the entries, each fed in order, so the result does not depend on how entries were batched.
    An (index, term) names one entry everywhere (log matching), so two replicas that applied
    the same entries from the same index report the same digest, and one that applied an entry
    later truncated away (another term at that index) does not."""

    def __init__(self, from_index: int) -> None:
        self.from_index = from_index
        self._crcs = [0, 0, 0]

    def add(self, terms: Sequence[int], kinds: Sequence[int], sizes: Sequence[int]) -> None:
        c = self._crcs
        c[0] = zlib.crc32(array("q", terms).tobytes(), c[0])
        c[1] = zlib.crc32(array("q", kinds).tobytes(), c[1])
        c[2] = zlib.crc32(array("q", sizes).tobytes(), c[2])

    def hex(self) -> str:
        return f"{self.from_index}:" + "".join(f"{c:08x}" for c in self._crcs)


@attrs.frozen
class AppendReply:
    status: Status
    message: str
    fields: dict[str, Any]

    @property
    def last_index(self) -> int:
        """The index of the last entry appended (an OK reply's)."""
        assert self.status is Status.OK, self
        return int(self.fields["index"])


class _Signal:
    """Inbox marker: work is waiting in a slot the raft loop reads after each drain."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"<{self.name}>"


PROPOSE = _Signal("appends waiting to be proposed")
PERSISTED = _Signal("the log became durable further")
TICK_DUE = _Signal("a tick the core may act on is due (the ticker)")


class _Control:
    """Inbox item: a control event and where its result goes."""

    def __init__(self, event: Event) -> None:
        self.event = event
        self.done = trio.Event()
        self.result: Result | None = None


def load_hard_state(paths: StorePaths) -> HardState:
    body = read_state_file(paths.root / "hardstate", HARDSTATE_MAGIC)
    if body is None:
        return HardState()
    configs = tuple(ConfigEntry.from_state(row) for row in body.get("configs", ()))
    return HardState(term=int(body["term"]), vote=body.get("vote"), configs=configs)


def save_hard_state(paths: StorePaths, hs: HardState) -> None:
    """Atomic and fsynced (state_file): runs in a worker thread."""
    body = {"term": hs.term, "vote": hs.vote, "configs": [c.to_state() for c in hs.configs]}
    write_state_file(paths.root / "hardstate", HARDSTATE_MAGIC, body)


class Node:
    def __init__(
        self,
        config: NodeConfig,
        store: LogStore,
        state_machine: StateMachine | None = None,
        *,
        rng: random.Random | None = None,
        connect: PeerConnector | None = None,
        offload: Offload = trio.to_thread.run_sync,
    ) -> None:
        """`connect` opens the stream of an outbound peer link (default: TCP from this
        replica's own address, transport.tcp_connector); tests pass memory streams.
        `offload(fn, *args)` runs the raft loop's blocking file writes (hard state,
        checkpoints) off the event loop; a test under a mock clock may run them inline, so
        virtual time does not race ahead while a worker thread writes."""
        self._offload = offload
        self.config = config
        self.store = store
        self.state_machine = state_machine or NullStateMachine()
        self._reads_bodies = getattr(self.state_machine, "reads_bodies", True)
        self.paths = StorePaths(config.store_dir)
        self.sync_flush = config.flush is FlushPolicy.SYNC_FLUSH
        checkpoint = store.read_checkpoint()
        self.core = RaftCore(
            config.self_id,
            config.raft,
            store,
            load_hard_state(self.paths),
            initial_membership=Membership(frozenset(config.peers)),
            rng=rng or random.Random(),
            commit_index=checkpoint.commit_index,
        )
        applied = min(checkpoint.applied_index, store.last_index)
        # a state machine with files of its own says how far they hold (it may lag the
        # checkpoint after a crash); the node applies from there, and it skips what it has
        kept = getattr(self.state_machine, "applied_index", None)
        if kept is not None:
            applied = min(applied, kept)
        self.applied_index = max(applied, store.first_index - 1)
        self.applied_digest = AppliedDigest(self.applied_index)
        self.role = RoleState(self.core.role, self.core.term, self.core.leader)
        self._inbox_send, self._inbox = trio.open_memory_channel[Any](limits.INBOX_EVENTS_MAX)
        self._flusher = Flusher(store, on_durable=self._on_durable)
        self.links = PeerLinks(
            group=config.group,
            self_id=config.self_id,
            peers=config.peers,
            segment_bytes=store.config.segment_bytes,
            on_disconnect=self.peer_disconnected,
            unacked_timeout_ms=config.peer_unacked_timeout_ms,
            connect=connect,
        )
        self._promises = Promises()  # acks and votes waiting for the disk
        self._shaper: ProposalShaper | None = getattr(self.state_machine, "shaper", None)
        self._log_trimmed: LogTrimmedListener | None = getattr(
            self.state_machine, "log_trimmed", None
        )
        self._shaped_check: tuple[int, int, int, int] | None = None
        # the clock (`_ticker`): when the next Tick is due, how many from then on the core
        # called quiet when the loop last went idle, when the ticker wakes the loop, its wait
        self._tick_period_s = config.tick_ms / 1000
        self._next_tick_at = 0.0
        self._quiet_ticks = 0
        self._wake_at = 0.0
        self._tick_wait: trio.CancelScope | None = None
        self._pending: list[PendingAppend] = []  # appends not yet proposed
        self._pending_entries = 0
        self._propose_signalled = False
        self._waiters = AppendWaiters()
        self._apply_wake = trio.Event()
        self._role_listeners: list[Callable[[RoleState], None]] = []
        self._role_changed = trio.Event()
        # the newest durability report not yet stepped, and whether PERSISTED is in the inbox
        self._persisted: Persisted | None = None
        self._persisted_signalled = False
        self.metrics: Counter[str] = Counter()  # counts for the status request
        self.started = trio.Event()
        self.stopping = False

    # --- what other tasks call ------------------------------------------------------------------

    def on_role_change(self, listener: Callable[[RoleState], None]) -> None:
        """`listener(RoleState)` runs on every change of role, term or leader (the broker
        re-registers with the name server from here)."""
        self._role_listeners.append(listener)

    async def wait_role_change(self) -> RoleState:
        await self._role_changed.wait()
        return self.role

    async def deliver(self, message: Message) -> None:
        """Hand a peer's message to the raft loop; waits only while the inbox is full. Without
        trio's checkpoint in `send` when there is room: the reader's next step is a wait for
        its socket anyway, and the checkpoint cost a scheduler pass a message (every append
        on a follower, every acknowledgement on a leader)."""
        try:
            self._inbox_send.send_nowait(message)
        except trio.WouldBlock:
            await self._inbox_send.send(message)

    def peer_disconnected(self, peer: str) -> None:
        # a full inbox is a busy node: the election timeout still covers a lost report
        with contextlib.suppress(trio.WouldBlock, trio.ClosedResourceError):
            self._inbox_send.send_nowait(PeerDisconnected(peer))

    def submit_append(self, bodies: Sequence[bytes], reply: Callable[..., None]) -> None:
        """Queue an append; `reply(status, message, fields)` answers it exactly once."""
        deadline = trio.current_time() + self.config.append_timeout_ms / 1000
        self._pending.append(PendingAppend(bodies, reply, deadline))
        self._pending_entries += len(bodies)
        if not self._propose_signalled:
            self._propose_signalled = True
            # when the inbox is full the raft loop is busy, and it proposes after its batch anyway
            with contextlib.suppress(trio.WouldBlock):
                self._inbox_send.send_nowait(PROPOSE)

    async def append(self, bodies: Sequence[bytes]) -> AppendReply:
        """Append `bodies` as consecutive entries and wait for the answer: Status.OK once a
        quorum holds them (fields `index`, the last one's, and `count`), else the refusal
        (NOT_LEADER with the leader's hint, BUSY, OUTCOME_UNKNOWN after the append timeout,
        ...). Only a leader proposes; see `accepting_appends`."""
        done = trio.Event()
        answer: list[AppendReply] = []

        def reply(status: Status, message: str, fields: dict[str, Any]) -> None:
            answer.append(AppendReply(status, message, fields))
            done.set()

        self.submit_append(bodies, reply)
        await done.wait()
        return answer[0]

    async def step(self, event: Event) -> Result | None:
        """Feed one control event (TransferLeadership, ChangeMembership) through the raft
        loop and return its result."""
        request = _Control(event)
        await self._inbox_send.send(request)
        await request.done.wait()
        return request.result

    # --- running ---------------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run until cancelled; `started` once every task runs. Listening is the embedder's
        (dledger/hosting.py): run it beside, or the node hears from no peer."""
        log.info(
            "node %s of group %s starting: %d peers, store %s, %s, last index %d, commit %d",
            self.config.self_id,
            self.config.group,
            len(self.config.peers),
            self.config.store_dir,
            self.config.flush.value,
            self.store.last_index,
            self.core.commit_index,
        )
        try:
            async with trio.open_nursery() as nursery:
                self._next_tick_at = trio.current_time() + self._tick_period_s
                await nursery.start(self._flusher.run)
                nursery.start_soon(self._raft_loop)
                nursery.start_soon(self._ticker)
                nursery.start_soon(self._applier)
                nursery.start_soon(self.links.run)
                nursery.start_soon(self._maintenance)
                self.started.set()
                task_status.started()
        finally:
            self.stopping = True
            with contextlib.suppress(Exception):  # best effort: the log is safe without it
                self.store.write_checkpoint(*self._checkpoint_marks())
            # Proposed appends are in the log and may still commit after a restart: unknown.
            # Appends not yet proposed are surely not stored: the client may retry elsewhere.
            self._waiters.fail_all(
                Status.OUTCOME_UNKNOWN, "the node stopped before the append committed"
            )
            for pending in self._pending:
                pending.reply(Status.SHUTTING_DOWN, "the node is shutting down", {})
            self._pending.clear()

    async def _raft_loop(self) -> None:
        inbox, metrics = self._inbox, self.metrics
        while True:
            self._plan_wake()
            event = await inbox.receive()
            await self._take_idle_ticks()
            await self._handle(event)
            handled = 1
            for _ in range(limits.DRAIN_EVENTS_MAX):
                try:
                    event = inbox.receive_nowait()
                except trio.WouldBlock:
                    break
                await self._handle(event)
                handled += 1
            metrics["raft_loop_wakeups"] += 1
            metrics["events"] += handled
            now = trio.current_time()
            if now >= self._next_tick_at:  # awake anyway: tick here (_ticker)
                self._tick_taken(now)
                await self._perform(self.core.step(Tick()))
            if self._persisted is not None:
                await self._step_persisted()
            if self._pending:
                if self._pending_entries >= limits.PROPOSE_DEFER_ENTRIES_MIN:
                    await trio.lowlevel.checkpoint()  # ready tasks may add appends to it
                await self._propose_pending()

    async def _handle(self, event: object) -> None:
        if event is PROPOSE or event is TICK_DUE:
            return  # proposing and ticking happen after the drain
        if event is PERSISTED:
            await self._step_persisted()  # promptly: a leader's commit may wait on it
            return
        if isinstance(event, _Control):
            fx = self.core.step(event.event)
            await self._perform(fx)
            event.result = fx.result
            event.done.set()
            return
        await self._perform(self.core.step(event))  # type: ignore[arg-type]

    async def _propose_pending(self) -> None:
        """Propose every queued append as one batch (group commit): one log write, one
        AppendEntries per follower, one fsync, however many clients asked."""
        while self._pending:
            self._propose_signalled = False
            take = entries = 0
            for pending in self._pending:
                if entries and entries + len(pending.bodies) > limits.PROPOSAL_ENTRIES_MAX:
                    break
                entries += len(pending.bodies)
                take += 1
            batch = self._pending[:take]
            del self._pending[:take]
            self._pending_entries -= entries
            payloads: list[bytes] = []
            for pending in batch:
                payloads.extend(pending.bodies)
            shaped = self._shape(payloads)
            if isinstance(shaped, ProposalRefused):
                for pending in batch:
                    pending.reply(shaped.status, shaped.message, {})
                continue
            fx = self.core.step(Propose(shaped))
            self.metrics["proposals"] += 1
            self.metrics["proposed_entries"] += len(payloads)
            result = fx.result
            if isinstance(result, Proposed):
                index = result.first - 1
                for pending in batch:
                    index += len(pending.bodies)
                    count = len(pending.bodies)
                    self._waiters.add(
                        Waiter(index, result.term, count, pending.reply, pending.deadline)
                    )
            else:
                assert isinstance(result, Refused), result
                if self._shaper is not None:
                    self._shaper.refused()
                status = REFUSAL_STATUS[result.refusal]
                message = result.refusal.value + (f": {result.detail}" if result.detail else "")
                fields = self.leader_hint(result.leader)
                for pending in batch:
                    pending.reply(status, message, fields)
            await self._perform(fx)

    def _shape(self, payloads: list[bytes]) -> list[bytes] | ProposalRefused:
        """The state machine's last word on a proposal, knowing each entry's index and byte
        position (the broker writes queue offsets and physical offsets into its records here).
        Positions are predicted as the store will assign them; the appends of this step check."""
        shaper = self._shaper
        if shaper is None:
            return payloads
        store = self.store
        first = store.last_index + 1
        position, segment_bytes = store.next_position, store.config.segment_bytes
        sizes = list(map(WITH_HEADER, map(len, payloads)))
        ends = list(accumulate(sizes, initial=position))
        if position % segment_bytes + ends[-1] - position <= segment_bytes - BLANK_BYTES_MIN:
            positions = ends[:-1]  # all in this segment, clear of its tail: back to back
        else:
            positions = []
            for size in sizes:
                position = entry_position(position, size, segment_bytes)
                positions.append(position)
                position += size
        try:
            shaped = shaper.shape(first, positions, payloads)
        except ProposalRefused as refusal:
            return refusal
        assert list(map(len, shaped)) == list(map(len, payloads)), "shaping keeps sizes"
        self._shaped_check = (first, positions[0], first + len(positions) - 1, positions[-1])
        return shaped

    def _check_shaped_positions(self) -> None:
        """The positions the shaper was told are those the store gave (a bug otherwise)."""
        if self._shaped_check is None:
            return
        first, first_position, last, last_position = self._shaped_check
        self._shaped_check = None
        if self.store.last_index >= last and self.store.first_index <= first:
            got = self.store.positions(first, first)[0], self.store.positions(last, last)[0]
            assert got == (first_position, last_position), (got, first_position, last_position)

    # --- effects --------------------------------------------------------------------------------

    async def _perform(self, fx: Effects) -> None:
        for notice in fx.notices:
            log.warning("%s", notice)
        offer = self.links.offer
        for envelope in fx.send_now:
            offer(envelope)
        persist = fx.persist
        if persist is not None:
            if persist.hard_state is not None:
                await self._offload(save_hard_state, self.paths, persist.hard_state)
            store = self.store
            cut = None
            if persist.reset is not None:
                store.reset(persist.reset)
                cut = persist.reset.prev.index
                log.warning(
                    "log restarted at index %d: this replica was behind the leader's first "
                    "retained entry, so entries up to %d were skipped (DLedger's way)",
                    cut + 1,
                    cut,
                )
                if self._log_trimmed is not None:
                    self._log_trimmed(store.start.position)
            if persist.truncate_after is not None:
                store.truncate_after(persist.truncate_after)
                cut = persist.truncate_after
                log.info("truncated the log after index %d (conflict with the leader)", cut)
            self._promises.log_changed(persist)
            if persist.append is not None:
                store.append(persist.append)
                self._check_shaped_positions()
            self._flusher.notify()
            if not self.sync_flush and persist.append is not None:
                self._report_durable(store.last_index)  # ASYNC_FLUSH: written counts as kept
        if fx.send_after_persist:
            durable = self._raft_durable_index()
            for envelope in self._promises.hold(fx.sync_through, fx.send_after_persist, durable):
                offer(envelope)
        if fx.commit_index is not None:
            self._waiters.commit(fx.commit_index, self._committed_term)
            self._apply_wake.set()
        if fx.role is not None:
            self._role_changed_to(fx.role)

    def _checkpoint_marks(self) -> tuple[int, int]:
        """(commit, applied) for a checkpoint: never past what this replica holds durably."""
        commit = min(self.core.commit_index, self._raft_durable_index())
        return commit, min(self.applied_index, commit)

    def _raft_durable_index(self) -> int:
        """Durable as far as promises go: fsynced under SYNC_FLUSH, written under ASYNC."""
        return self.store.durable_index if self.sync_flush else self.store.last_index

    def _committed_term(self, index: int) -> int | None:
        if index < self.store.first_index or index > self.store.last_index:
            return None
        return self.store.term_at(index)

    def _on_durable(self, durable: int) -> None:
        """The flusher made the log durable through `durable` (SYNC_FLUSH path)."""
        if self.sync_flush:
            self._report_durable(durable)
        # The applier stops at min(commit, durable): wake it only when durable was the bound.
        # Usually commit is (a follower's commit trails what the leader sends it; a leader's
        # rises when the raft loop steps the Persisted just reported, and wakes it there),
        # and a wake for nothing costs the round a scheduler pass.
        if self.applied_index < min(self.core.commit_index, durable):
            self._apply_wake.set()

    def _report_durable(self, durable: int) -> None:
        """Send the promises the log now covers, and have the raft loop tell the core. The
        report waits in a slot, not in the inbox: a newer one replaces it, and a full inbox
        (a busy loop, which reads the slot after its drain) never holds it back."""
        store = self.store
        log_start = store.first_index - 1
        term = store.term_at(durable) if durable > log_start else 0
        ready, persisted = self._promises.durable(EntryId(durable, term), log_start)
        for envelope in ready:
            self.links.offer(envelope)
        if persisted is None:
            return
        self._persisted = persisted
        if not self._persisted_signalled:
            self._persisted_signalled = True
            with contextlib.suppress(trio.WouldBlock):
                self._inbox_send.send_nowait(PERSISTED)

    async def _step_persisted(self) -> None:
        persisted, self._persisted = self._persisted, None
        self._persisted_signalled = False
        if persisted is not None:
            await self._perform(self.core.step(persisted))

    def _role_changed_to(self, role: RoleState) -> None:
        old = self.role
        self.role = role
        if role.role is not old.role or role.leader != old.leader:
            log.info(
                "%s is now %s in term %d (leader %s)",
                self.config.self_id,
                role.role.value,
                role.term,
                role.leader,
            )
        for listener in self._role_listeners:
            listener(role)
        self._role_changed.set()
        self._role_changed = trio.Event()

    # --- clocks and background work --------------------------------------------------------

    async def _ticker(self) -> None:
        """Wakes an idle raft loop when a Tick may act (a heartbeat, an election, a quorum
        check, a transfer's end), not every tick: each wake-up of an idle process costs ~300 us
        of CPU here (the deadline's cancel and its exception unwound, the scheduler, caches
        gone cold), which at 100 ticks a second was most of an idle replica's 5 % of a core.
        The loop plans the deadline before it waits (`_plan_wake`) and takes the ticks it
        slept through when it wakes (`_take_idle_ticks`); a loop woken by events more often
        than a tick never lets the deadline fire."""
        while True:
            with trio.CancelScope(deadline=self._wake_at) as self._tick_wait:
                await trio.sleep_forever()
            self._tick_wait = None
            self._wake_at = math.inf  # until the loop, woken by this, plans again
            await self._inbox_send.send(TICK_DUE)

    def _plan_wake(self) -> None:
        """Before the loop waits: the ticks the core calls quiet from here need no wake-up,
        so the ticker wakes it half a period after the first one that may act is due (a loop
        woken by an event meanwhile takes that tick itself)."""
        quiet = self._quiet_ticks = self.core.quiet_ticks()
        wake_at = self._next_tick_at + (quiet + 0.5) * self._tick_period_s
        if wake_at != self._wake_at:
            self._wake_at = wake_at
            if self._tick_wait is not None:
                self._tick_wait.deadline = wake_at

    async def _take_idle_ticks(self) -> None:
        """After a wait: the ticks that fell due while the loop waited, at once and before
        the events that woke it, but no more than the core called quiet when the loop began
        to wait. So the core's clock keeps real time through idle periods, and a tick that
        may act (an election) is still taken only after the events (the heartbeat that
        arrived meanwhile), once per wake-up: a process stalled past a timeout gets no
        burst of acting ticks when it resumes, as before."""
        now = trio.current_time()
        if now < self._next_tick_at or not self._quiet_ticks:
            return
        due = 1 + int((now - self._next_tick_at) / self._tick_period_s)
        taken = min(due, self._quiet_ticks)
        self._quiet_ticks -= taken
        self._next_tick_at += taken * self._tick_period_s
        step = self.core.step
        for _ in range(taken):
            await self._perform(step(Tick()))

    def _tick_taken(self, now: float) -> None:
        """A Tick is given to the core at `now`: the next is due a period after the one just
        taken, or a period from now if that one was more than a period late."""
        period = self._tick_period_s
        if now - self._next_tick_at > period:
            self._next_tick_at = now + period
        else:
            self._next_tick_at += period

    async def _applier(self) -> None:
        store = self.store
        while True:
            target = min(self.core.commit_index, self._raft_durable_index())
            if self.applied_index >= target:
                await self._apply_wake.wait()
                self._apply_wake = trio.Event()
                # A commit woke the writers waiting for it along with this task: let them
                # answer (a leader's SEND_OKs) before the applier takes the loop, whatever
                # order trio's batch runs in (tests/node/test_embedded.py)
                await trio.lowlevel.checkpoint()
                continue
            if self.applied_index < store.first_index - 1:
                log.warning(
                    "skipping apply to %d: entries before it are not stored here",
                    store.first_index - 1,
                )
                self.applied_index = store.first_index - 1
                continue
            hi = min(target, self.applied_index + limits.APPLY_BATCH_ENTRIES_MAX)
            lo = self.applied_index + 1
            if self._reads_bodies:  # the digest's terms, kinds and sizes from what was read
                batch = store.read(lo, hi, limits.APPLY_BATCH_BYTES_MAX)
                hi = batch.last_index
                terms, kinds = batch.terms, batch.kinds
                sizes = list(map(WITH_HEADER, map(len, batch.payloads)))
            else:
                terms, kinds, sizes = store.read_meta(lo, hi)
                batch = EntryBatch(lo, terms, kinds, [b""] * len(terms))
            self.state_machine.apply(batch)
            self.applied_digest.add(terms, kinds, sizes)
            self.applied_index = hi
            await trio.lowlevel.checkpoint()

    async def _maintenance(self) -> None:
        last_checkpoint = last_retention = trio.current_time()
        written = (-1, -1)
        while True:
            await trio.sleep(limits.MAINTENANCE_INTERVAL_S)
            now = trio.current_time()
            self._waiters.expire(now)
            self._expire_pending(now)
            if now - last_checkpoint >= self.config.checkpoint_interval_ms / 1000:
                last_checkpoint = now
                marks = self._checkpoint_marks()
                if marks != written:
                    written = marks
                    await self._offload(self.store.write_checkpoint, *marks)
            if now - last_retention >= limits.RETENTION_INTERVAL_S:
                last_retention = now
                self._retain()

    def _expire_pending(self, now: float) -> None:
        if self._pending and self._pending[0].deadline <= now:
            keep = []
            for pending in self._pending:
                if pending.deadline <= now:
                    pending.reply(Status.OUTCOME_UNKNOWN, "not proposed before the deadline", {})
                    self._pending_entries -= len(pending.bodies)
                else:
                    keep.append(pending)
            self._pending = keep

    def _retain(self) -> None:
        """Delete old segments, never past what is applied here or, on a leader, past what a
        live follower still needs."""
        keep_from = self.applied_index + 1
        status = self.core.status()
        for peer, progress in status.peers.items():
            if self.links.stats[peer].connected:
                keep_from = min(keep_from, progress.match + 1)
        deleted = self.store.delete_expired(
            now=datetime.now(),
            keep_from_index=keep_from,
            file_reserved_hours=self.config.file_reserved_hours,
            delete_when_hour=self.config.delete_when_hour,
            disk_max_used_ratio=self.config.disk_max_used_ratio,
        )
        if deleted:
            log.info(
                "retention deleted %s; first index is now %d",
                ", ".join(deleted),
                self.store.first_index,
            )
            if self._log_trimmed is not None:
                self._log_trimmed(self.store.start.position)

    # --- reading state ---------------------------------------------------------------------------

    def leader_hint(self, leader: str | None) -> dict[str, object]:
        if leader is None or leader not in self.config.peers:
            return {}
        return {"leader": leader, "leader_addr": str(self.config.peers[leader])}

    def status(self) -> dict[str, object]:
        core = self.core.status()
        peers = {}
        for peer in self.config.peers:
            if peer == self.config.self_id:
                continue
            p = core.peers.get(peer)
            link = self.links.stats[peer]
            peers[peer] = {
                "connected": link.connected,
                "match_index": p.match if p else None,
                "next_index": p.next if p else None,
                "state": p.state if p else None,
                "lag": (core.last_index - p.match) if p else None,
                "dropped": link.dropped,
            }
        return {
            "group": self.config.group,
            "node": self.config.self_id,
            "role": core.role.value,
            "term": core.term,
            "leader": core.leader,
            **self.leader_hint(core.leader),
            "first_index": core.first_index,
            "last_index": core.last_index,
            "commit_index": core.commit_index,
            "applied_index": self.applied_index,
            "applied_digest": self.applied_digest.hex(),
            "durable_index": self.store.durable_index,
            "flush": self.config.flush.value,
            "flushes": self.store.flushes,
            "fsyncs": self.store.fsyncs,
            "voters": sorted(core.membership.voters),
            "learners": sorted(core.membership.learners),
            "transfer_target": core.transfer_target,
            "removed_at": core.removed_at,
            "pending_appends": self._pending_entries,
            "waiting_appends": len(self._waiters),
            "metrics": {**self.metrics, **self._link_metrics()},
            "peers": peers,
        }

    def _link_metrics(self) -> dict[str, int]:
        stats = self.links.stats.values()
        return {
            "peer_frames_sent": sum(s.frames_sent for s in stats),
            "peer_sends": sum(s.sends for s in stats),
            "peer_bytes_sent": sum(s.bytes_sent for s in stats),
        }

    @property
    def is_leader(self) -> bool:
        return self.core.role is Role.LEADER

    @property
    def accepting_appends(self) -> bool:
        """Leader and not stopping: an append submitted now is proposed."""
        return self.core.role is Role.LEADER and not self.stopping

    @property
    def leader(self) -> str | None:
        return self.core.leader

    @property
    def term(self) -> int:
        return self.core.term

    @property
    def commit_index(self) -> int:
        return self.core.commit_index

    @property
    def first_index(self) -> int:
        return self.store.first_index

    @property
    def last_index(self) -> int:
        return self.store.last_index

    @property
    def segment_bytes(self) -> int:
        """The log's segment size: the same on every replica, or positions would differ."""
        return self.store.config.segment_bytes

    def entry(self, index: int) -> StoredEntry:
        """The stored entry at `index` (Compacted, IndexOutOfRange, CorruptEntry as the store)."""
        return self.store.get(index)
