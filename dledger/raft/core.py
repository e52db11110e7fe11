"""The Raft core: one event in, effects out; no socket, file, clock, thread or global random.

Reading order: `step` dispatches; `_receive` applies the term rules every message obeys
(section 5.1 of the paper, plus pre-vote and the leader lease from section 9.6 of the
dissertation); then one handler per message, grouped by the role that receives it.

The core reads the log through `RaftLog` and changes it only through `Persist` effects,
which the caller performs before the next event. Within one step the core may both change
the log and read it back (a new leader appends its no-op and sends it), so it reads through
`self.view` (`log_view.py`), which sees the step's pending changes on top of the log, and
changes the log through `_append`, `_truncate_after` and `_reset`, which also keep the
configuration history (`config_history.py`) and the durable index in step with the log.

This module is longer than ~400 lines because the protocol is one state machine whose
handlers share its state; the step's view of the log, the configuration history, the
leader-only state, the follower progress and membership live in their own modules.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import assert_never

import attrs

from dledger.raft.config import RaftConfig
from dledger.raft.config_history import ConfigHistory
from dledger.raft.entries import (
    EntryBatch,
    EntryId,
    EntryKind,
    LogStart,
    NodeId,
    data_batch,
    empty_batch,
)
from dledger.raft.events import (
    NO_EFFECTS,
    Accepted,
    ChangeMembership,
    Effects,
    Event,
    HardState,
    PeerDisconnected,
    Persist,
    Persisted,
    Propose,
    Proposed,
    Refusal,
    Refused,
    Result,
    Role,
    RoleState,
    Tick,
    TransferLeadership,
)
from dledger.raft.leader import LeaderState
from dledger.raft.log_view import LogView
from dledger.raft.membership import (
    ChangeKind,
    ChangeRefused,
    ConfigEntry,
    Membership,
    apply_change,
    majority_index,
)
from dledger.raft.messages import (
    AppendEntries,
    AppendEntriesReply,
    Envelope,
    Heartbeat,
    HeartbeatReply,
    InstallLogStart,
    Message,
    RequestVote,
    RequestVoteReply,
    TimeoutNow,
)
from dledger.raft.progress import Progress, ProgressState
from dledger.raft.storage import RaftLog

_LEADER_MESSAGES = (AppendEntries, Heartbeat, InstallLogStart, TimeoutNow)


@attrs.frozen
class PeerStatus:
    match: int
    next: int
    state: str
    recent_active: bool


@attrs.frozen
class CoreStatus:
    id: NodeId
    role: Role
    term: int
    leader: NodeId | None
    vote: NodeId | None
    commit_index: int
    last_index: int
    durable_index: int
    first_index: int
    membership: Membership
    peers: dict[NodeId, PeerStatus]
    transfer_target: NodeId | None
    removed_at: int  # > 0: a voter says we are out of the configuration committed there


class RaftCore:
    def __init__(
        self,
        node_id: NodeId,
        config: RaftConfig,
        log: RaftLog,
        hard_state: HardState,
        *,
        initial_membership: Membership,
        rng: random.Random,
        commit_index: int = 0,
    ) -> None:
        """`log` must hold only durable entries (a freshly recovered store); `commit_index`
        is the last one known (a checkpoint), clamped to the log."""
        self.id = node_id
        self.cfg = config
        self.log = log
        self.view = LogView(log)  # the log as of this step: the store plus pending changes
        self.rng = rng
        self.term = hard_state.term
        self.vote = hard_state.vote
        self.configs = ConfigHistory.recover(hard_state.configs, log, initial_membership)
        self.role = Role.FOLLOWER
        self.leader: NodeId | None = None
        start = log.start.prev.index
        self.commit_index = max(start, min(commit_index, log.last_index))
        self.durable_index = log.last_index
        self.election_elapsed = 0
        self.heartbeat_elapsed = 0
        self.randomized_timeout = self._random_timeout()
        self.votes: dict[NodeId, bool] = {}
        self.lead: LeaderState | None = None
        # > 0 once a voter told us its configuration committed at that index leaves us out:
        # we stop campaigning until our own configuration changes or a leader contacts us.
        self.removed_at = 0
        self._expected_last = log.last_index
        self._begin()

    # --- reading state ----------------------------------------------------------------------------

    @property
    def membership(self) -> Membership:
        return self.configs.latest.membership

    def hard_state(self) -> HardState:
        return HardState(self.term, self.vote, self.configs.as_tuple())

    def status(self) -> CoreStatus:
        peers = {}
        transfer = None
        if self.lead is not None:
            transfer = self.lead.transfer_target
            for peer, pr in self.lead.progress.items():
                peers[peer] = PeerStatus(pr.match, pr.next, pr.state.value, pr.recent_active)
        return CoreStatus(
            id=self.id,
            role=self.role,
            term=self.term,
            leader=self.leader,
            vote=self.vote,
            commit_index=self.commit_index,
            last_index=self.view.last_index(),
            durable_index=self.durable_index,
            first_index=self.view.start().prev.index + 1,
            membership=self.membership,
            peers=peers,
            transfer_target=transfer,
            removed_at=self.removed_at,
        )

    # --- one step ---------------------------------------------------------------------------------

    def step(self, event: Event | Message) -> Effects:
        assert self.log.last_index == self._expected_last, (
            f"{self.id}: the log ends at {self.log.last_index}, the core expected "
            f"{self._expected_last}: the caller did not perform the last Persist"
        )
        self._begin()
        match event:  # the most frequent first: each case that fails costs an isinstance
            case Persisted():
                self._persisted(event.through)
            case Propose():
                self._propose(event.payloads)
            case Tick():
                self._tick()
            case PeerDisconnected():
                self._peer_disconnected(event.peer)
            case TransferLeadership():
                self._transfer(event.target)
            case ChangeMembership():
                self._change_membership(event.kind, event.node)
            case _:
                self._receive(event)
        return self._finish()

    def _begin(self) -> None:
        self._send_now: list[Envelope] = []
        self._send_after: list[Envelope] = []
        self._sync_through = 0
        self._hs_dirty = False
        self.view.clear()
        self._commit_before = self.commit_index
        self._role_before = (self.role, self.term, self.leader)
        self._result: Result | None = None
        self._notices: list[str] = []

    def _finish(self) -> Effects:
        view = self.view
        reset, truncate, append = view.pending_reset, view.pending_truncate, view.pending_append
        persist = None
        if self._hs_dirty or reset is not None or truncate is not None or append is not None:
            persist = Persist(
                hard_state=self.hard_state() if self._hs_dirty else None,
                reset=reset,
                truncate_after=truncate,
                append=append,
            )
        role = None
        if (self.role, self.term, self.leader) != self._role_before:
            role = RoleState(self.role, self.term, self.leader)
        commit = self.commit_index if self.commit_index != self._commit_before else None
        self._expected_last = view.last_index()
        if not (persist or self._send_now or self._send_after or role or commit or self._result):
            return NO_EFFECTS
        return Effects(
            send_now=tuple(self._send_now),
            persist=persist,
            send_after_persist=tuple(self._send_after),
            sync_through=self._sync_through,
            commit_index=commit,
            role=role,
            result=self._result,
            notices=tuple(self._notices),
        )

    def _send(self, to: NodeId, message: Message) -> None:
        self._send_now.append(Envelope(to, message))

    def _send_after_persist(self, to: NodeId, message: Message, sync_through: int) -> None:
        """A promise (vote grant, append ack): it leaves once the step's persist is durable and
        the log is durable through sync_through."""
        self._send_after.append(Envelope(to, message))
        self._sync_through = max(self._sync_through, sync_through)

    # --- changing the log: the step's view, the durable index and the configurations -----------

    def _append(self, batch: EntryBatch) -> None:
        self.view.append(batch)
        if EntryKind.CONFIG in batch.kinds:
            for offset, kind in enumerate(batch.kinds):
                if kind == EntryKind.CONFIG:
                    membership = Membership.decode(batch.payloads[offset])
                    index = batch.first_index + offset
                    self.configs.add(ConfigEntry(index, batch.terms[offset], membership))
                    self._configs_changed()

    def _truncate_after(self, index: int) -> None:
        assert index >= self.commit_index, f"{self.id}: truncating committed entries after {index}"
        self.view.truncate_after(index)
        self.durable_index = min(self.durable_index, index)
        if self.configs.truncate_after(index):
            self._configs_changed()

    def _reset(self, start: LogStart, config: ConfigEntry) -> None:
        self.view.reset(start)
        self.durable_index = start.prev.index
        self.configs.reset(config)
        self._configs_changed()

    def _configs_changed(self) -> None:
        self.removed_at = 0  # our own log now says whether we are a voter
        self._hs_dirty = True
        if self.lead is not None:
            self._sync_progress_with_membership()

    def _collapse_configs(self) -> None:
        """Forget configurations older than the one in effect at the log start: nobody can ask
        for them (InstallLogStart sends the one at the start)."""
        self.configs.collapse(min(self.commit_index, self.view.start().prev.index))

    # --- roles ----------------------------------------------------------------------------------

    def _random_timeout(self) -> int:
        return self.rng.randrange(self.cfg.election_ticks_min, self.cfg.election_ticks_max)

    def _reset_timers(self) -> None:
        self.election_elapsed = 0
        self.heartbeat_elapsed = 0
        self.randomized_timeout = self._random_timeout()

    def _set_term(self, term: int) -> None:
        if term != self.term:
            assert term > self.term, (term, self.term)
            self.term = term
            self.vote = None
            self._hs_dirty = True

    def _become_follower(self, term: int, leader: NodeId | None) -> None:
        self._set_term(term)
        self.role = Role.FOLLOWER
        self.leader = leader
        self.lead = None
        self.votes = {}
        self._reset_timers()

    def _promotable(self) -> bool:
        return self._electorate() is not None

    def _electorate(self) -> frozenset[NodeId] | None:
        """The voters among whom we may campaign, or None when we may not (also while a voter
        has told us we were removed).

        Our newest configuration's voters when it counts us. When it leaves us out but is not
        committed, the configuration before it if that one counts us: the change may yet be
        lost with the leader that proposed it, and until it commits our log may be the only
        one a majority will vote for. A leader that removed itself and then lost its
        followers, or a node that took the removal from such a leader, holds that newest log;
        if it never campaigned, the rest could not win against it and no leader would be
        elected (the simulator's seed 7460, 5 nodes). A campaign still counts the votes of the
        newest configuration, as Raft's single-server changes require, so a node outside it
        needs a majority of the others; once elected it commits its removal and hands over,
        as a leader that removed itself does."""
        if self.removed_at:
            return None
        voters = self.membership.voters
        if self.id in voters:
            return voters
        previous = self.configs.previous
        if self.configs.latest.index > self.commit_index and previous is not None:
            before = previous.membership.voters
            if self.id in before:
                return before
        return None

    def _in_lease(self) -> bool:
        """We heard from a live leader within the minimum election timeout (a leader counts
        itself): a vote request that is not a leadership transfer is then disruptive."""
        return (
            self.cfg.check_quorum
            and self.leader is not None
            and self.election_elapsed < self.cfg.election_ticks_min
        )

    def _campaign(self, pre_vote: bool, transfer: bool = False) -> None:
        voters = self.membership.voters
        self.votes = {self.id: True}
        if pre_vote:
            self.role = Role.PRE_CANDIDATE
            self.leader = None
            self._reset_timers()
            term = self.term + 1
        else:
            self._set_term(self.term + 1)
            self.vote = self.id
            self._hs_dirty = True
            self.role = Role.CANDIDATE
            self.leader = None
            self.lead = None
            self._reset_timers()
            term = self.term
        if voters == {self.id}:
            self._election_won(pre_vote)
            return
        last = self.view.last_id()
        for voter in sorted(voters - {self.id}):
            self._send(voter, RequestVote(term, self.id, last, pre_vote, transfer))

    def _election_won(self, pre_vote: bool) -> None:
        if pre_vote:
            self._campaign(pre_vote=False)
        else:
            self._become_leader()

    def _become_leader(self) -> None:
        assert self.role is Role.CANDIDATE, self.role
        self.role = Role.LEADER
        self.leader = self.id
        self.votes = {}
        self._reset_timers()
        last = self.view.last_index()
        self.lead = LeaderState(progress={}, pending_config_index=self.configs.latest.index)
        self._sync_progress_with_membership()
        self._append(EntryBatch(last + 1, [self.term], [EntryKind.NOOP.value], [b""]))
        self._broadcast_append()

    def _sync_progress_with_membership(self) -> None:
        lead = self.lead
        assert lead is not None
        members = self.membership.members - {self.id}
        for peer in list(lead.progress):
            if peer not in members:
                del lead.progress[peer]
        for peer in sorted(members):
            if peer not in lead.progress:
                lead.progress[peer] = Progress(
                    match=0, next=self.view.last_index() + 1, inflight_max=self.cfg.inflight_max
                )
        if lead.transfer_target is not None and lead.transfer_target not in members:
            lead.stop_transfer()

    # --- inputs that are not messages -----------------------------------------------------------

    def _tick(self) -> None:
        if self.role is Role.LEADER:
            self._tick_leader()
            return
        self.election_elapsed += 1
        if self._promotable() and self.election_elapsed >= self.randomized_timeout:
            self._campaign(pre_vote=self.cfg.pre_vote)
        elif (
            self.role is Role.PRE_CANDIDATE
            and self.election_elapsed % self.cfg.prevote_retry_ticks == 0
        ):
            self._retry_prevote()

    def quiet_ticks(self) -> int:
        """How many Ticks from now will only count: no message, no role change, nothing for
        the caller to do. The Tick after them may act. Exact for the state as it is; any
        other step may change it. A node that idles sleeps through these and gives them to
        the core at once when it wakes (Node._raft_loop), instead of waking every tick."""
        cfg = self.cfg
        if self.role is Role.LEADER:
            lead = self.lead
            assert lead is not None
            due = min(
                cfg.heartbeat_ticks - self.heartbeat_elapsed,
                cfg.election_ticks_min - self.election_elapsed,  # the quorum check
            )
            if lead.transfer_target is not None:
                due = min(due, cfg.transfer_ticks_max - lead.transfer_elapsed)
            return max(due - 1, 0)
        due = cfg.election_ticks_max  # a node that may not campaign: still woken now and then
        if self._promotable():
            due = min(due, self.randomized_timeout - self.election_elapsed)
        if self.role is Role.PRE_CANDIDATE:
            retry = cfg.prevote_retry_ticks
            due = min(due, retry - self.election_elapsed % retry)
        return max(due - 1, 0)

    def _retry_prevote(self) -> None:
        """Ask again those who refused or did not answer: a voter that refused because it
        still heard the leader may have lost it since (a dead leader's connections drop at
        slightly different moments on each follower). A pre-vote changes no state, so asking
        again is free of risk."""
        last = self.view.last_id()
        for voter in sorted(self.membership.voters - {self.id}):
            if not self.votes.get(voter, False):
                self.votes.pop(voter, None)
                self._send(voter, RequestVote(self.term + 1, self.id, last, True))

    def _tick_leader(self) -> None:
        lead = self.lead
        assert lead is not None
        self.heartbeat_elapsed += 1
        self.election_elapsed += 1
        if self.election_elapsed >= self.cfg.election_ticks_min:
            self.election_elapsed = 0
            if self.cfg.check_quorum and not self._quorum_active():
                self._become_follower(self.term, None)
                return
        if lead.transfer_target is not None:
            lead.transfer_elapsed += 1
            if lead.transfer_elapsed >= self.cfg.transfer_ticks_max:
                lead.stop_transfer()
                lead.preferred_cooldown = self.cfg.election_ticks_max  # do not retry at once
        elif lead.preferred_cooldown:
            lead.preferred_cooldown -= 1
        if self.heartbeat_elapsed >= self.cfg.heartbeat_ticks:
            self.heartbeat_elapsed = 0
            for peer, pr in lead.progress.items():
                self._send(peer, Heartbeat(self.term, self.id, min(pr.match, self.commit_index)))
            self._promote_caught_up_learners()
            self._hand_over_to_preferred_leader()

    def _quorum_active(self) -> bool:
        lead = self.lead
        assert lead is not None
        voters = self.membership.voters
        active = sum(1 for v in voters if v == self.id or lead.progress[v].recent_active)
        for pr in lead.progress.values():
            pr.recent_active = False
        return active >= self.membership.quorum

    def _peer_disconnected(self, peer: NodeId) -> None:
        if self.role is Role.LEADER:
            assert self.lead is not None
            pr = self.lead.progress.get(peer)
            if pr is not None and pr.state is ProgressState.REPLICATE:
                pr.become_probe()  # whatever was in flight on that connection is gone
            return
        if self.role is not Role.FOLLOWER or peer != self.leader:
            return
        # The leader's connection dropped: it most likely died. Campaign without waiting out an
        # election timeout, staggered by rank so that two followers rarely split the vote. Our
        # peers grant the pre-vote only if they, too, have lost the leader.
        self.leader = None
        electorate = self._electorate()
        if electorate is None:
            return
        rank = sorted(electorate - {peer}).index(self.id)
        delay = rank * self.cfg.leader_lost_stagger_ticks
        self.election_elapsed = max(self.election_elapsed, self.randomized_timeout - delay)
        if self.election_elapsed >= self.randomized_timeout:
            self._campaign(pre_vote=self.cfg.pre_vote)

    def _persisted(self, through: EntryId) -> None:
        index = through.index
        if index <= self.durable_index or index > self.view.last_index():
            return
        if index < self.view.start().prev.index or self.view.term_at(index) != through.term:
            return  # stale: that entry was truncated since the flush began
        self.durable_index = index
        if self.role is Role.LEADER:
            self._maybe_commit()

    def _propose(self, payloads: Sequence[bytes]) -> None:
        lead = self.lead
        if lead is None:
            self._result = Refused(Refusal.NOT_LEADER, self.leader)
            return
        if lead.transfer_target is not None:
            self._result = Refused(Refusal.TRANSFERRING, lead.transfer_target)
            return
        if not payloads:
            self._result = Refused(Refusal.BAD_REQUEST, self.id, "no payloads")
            return
        nbytes = sum(map(len, payloads))
        if (
            lead.uncommitted_bytes
            and lead.uncommitted_bytes + nbytes > self.cfg.uncommitted_bytes_max
        ):
            self._result = Refused(Refusal.BUSY, self.id)
            return
        batch = data_batch(self.view.last_index() + 1, self.term, payloads)
        self._append(batch)
        lead.add_uncommitted(batch.last_index, nbytes)
        self._result = Proposed(batch.first_index, batch.last_index, self.term)
        self._broadcast_append()

    def _transfer(self, target: NodeId) -> None:
        lead = self.lead
        if lead is None:
            self._result = Refused(Refusal.NOT_LEADER, self.leader)
            return
        if target == self.id:
            self._result = Accepted(target)
            return
        if target not in self.membership.voters:
            self._result = Refused(Refusal.BAD_REQUEST, self.id, f"{target} is not a voter")
            return
        self._start_transfer(target)
        self._result = Accepted(target)

    def _start_transfer(self, target: NodeId) -> None:
        lead = self.lead
        assert lead is not None
        lead.start_transfer(target)
        if lead.progress[target].match == self.view.last_index():
            self._send(target, TimeoutNow(self.term, self.id))
        else:
            self._send_append(target)

    def _change_membership(self, kind: ChangeKind, node: NodeId) -> None:
        lead = self.lead
        if lead is None:
            self._result = Refused(Refusal.NOT_LEADER, self.leader)
            return
        if lead.pending_config_index > self.commit_index:
            self._result = Refused(Refusal.CONFIG_PENDING, self.id)
            return
        if lead.transfer_target is not None:
            self._result = Refused(Refusal.TRANSFERRING, lead.transfer_target)
            return
        membership = apply_change(self.membership, kind, node)
        if isinstance(membership, ChangeRefused):
            self._result = Refused(Refusal.BAD_REQUEST, self.id, str(membership))
            return
        if kind is ChangeKind.ADD_VOTER:
            lead.auto_promote.add(node)
        self._append_config(membership)

    def _append_config(self, membership: Membership) -> None:
        lead = self.lead
        assert lead is not None
        index = self.view.last_index() + 1
        self._append(
            EntryBatch(index, [self.term], [EntryKind.CONFIG.value], [membership.encode()])
        )
        lead.pending_config_index = index
        self._result = Proposed(index, index, self.term)
        self._broadcast_append()

    def _promote_caught_up_learners(self) -> None:
        lead = self.lead
        assert lead is not None
        if lead.pending_config_index > self.commit_index or lead.transfer_target is not None:
            return
        for node in sorted(lead.auto_promote):
            if node not in self.membership.learners:
                lead.auto_promote.discard(node)
            elif lead.progress[node].match >= self.commit_index:
                lead.auto_promote.discard(node)
                promoted = apply_change(self.membership, ChangeKind.PROMOTE, node)
                assert isinstance(promoted, Membership), promoted  # it is a learner
                self._append_config(promoted)
                self._result = None  # nobody asked for this one
                return

    def _hand_over_to_preferred_leader(self) -> None:
        lead = self.lead
        preferred = self.cfg.preferred_leader
        assert lead is not None
        if (
            preferred is None
            or preferred == self.id
            or preferred not in self.membership.voters
            or lead.transfer_target is not None
            or lead.preferred_cooldown
        ):
            return
        pr = lead.progress[preferred]
        if (
            pr.recent_active
            and pr.state is ProgressState.REPLICATE
            and pr.match >= self.commit_index
        ):
            self._start_transfer(preferred)

    # --- messages ------------------------------------------------------------------------------

    def _receive(self, m: Message) -> None:
        if isinstance(m, RequestVote):
            removed = self._removal_of(m.candidate, m.last_log)
            if removed is not None:  # whatever its term: a node outside the group cannot disrupt
                reply = RequestVoteReply(
                    self.term, self.id, False, m.pre_vote, removed.index, removed.term
                )
                self._send(m.candidate, reply)
                return
        elif isinstance(m, RequestVoteReply) and m.removed_at:
            self._on_removed(m)
            return
        if m.term > self.term:
            if isinstance(m, RequestVote):
                if not m.pre_vote:
                    if self._in_lease() and not m.transfer:
                        return  # a leader we still hear from is alive: ignore the disruption
                    self._become_follower(m.term, None)
            elif isinstance(m, RequestVoteReply) and m.pre_vote and m.granted:
                pass  # a granted pre-vote answers in the term we would campaign in
            else:
                leader = m.sender if isinstance(m, _LEADER_MESSAGES) else None
                self._become_follower(m.term, leader)
        elif m.term < self.term:
            self._receive_stale(m)
            return
        match m:  # replication, heartbeats, elections, then the rare ones
            case AppendEntries():
                self._on_append_entries(m)
            case AppendEntriesReply():
                self._on_append_reply(m)
            case Heartbeat():
                self._on_heartbeat(m)
            case HeartbeatReply():
                self._on_heartbeat_reply(m)
            case RequestVote():
                self._on_request_vote(m)
            case RequestVoteReply():
                self._on_vote_reply(m)
            case InstallLogStart():
                self._on_install_log_start(m)
            case TimeoutNow():
                self._on_timeout_now(m)
            case _:
                assert_never(m)

    def _receive_stale(self, m: Message) -> None:
        """A message from an older term. A leader that was deposed while cut off learns our
        term from the reply; everything else from the past is dropped."""
        if isinstance(m, (AppendEntries, InstallLogStart)):
            self._send(m.sender, AppendEntriesReply(self.term, self.id, False, 0))
        elif isinstance(m, Heartbeat):
            self._send(m.sender, HeartbeatReply(self.term, self.id))
        elif isinstance(m, RequestVote) and m.pre_vote:
            self._send(m.sender, RequestVoteReply(self.term, self.id, False, True))

    def _removal_of(self, node: NodeId, last: EntryId) -> ConfigEntry | None:
        """Our newest configuration if it is committed, leaves `node` out, and `node`'s log
        (ending at `last`) does not hold the entry that carries it; else None
        (`ConfigHistory.removal_of` says when a log cannot hold it).

        A voter removed while it was down never learns of its removal from its own log, and
        without this would campaign for good with pre-votes nobody grants. Such a node is no
        voter in any configuration that can still win an election: a leader that added it back
        would have replicated that entry to it first (a learner catches up before it is
        promoted), and committed entries are never cut. This also covers a node whose log runs
        past the index with entries of an older leader that never committed. A log that ends
        at or past the index in the entry's term or later may hold it, and the node may have
        been added back while we lagged behind; it gets an ordinary answer, since refusing it
        could leave a group that needs our vote without a leader."""
        return self.configs.removal_of(node, last, self.commit_index)

    def _on_removed(self, m: RequestVoteReply) -> None:
        """A voter says its configuration committed at m.removed_at (by an entry of
        m.removed_term) leaves us out. Believed only when that entry is newer than our own
        newest configuration's: a voter lagging behind us may not know that we were added
        back. Newer by term first: a configuration of ours past that index but of an older term
        came from a leader that never committed it (committed entries are in every later
        leader's log, and terms never fall along a log)."""
        told = EntryId(m.removed_at, m.removed_term)
        if (
            self.removed_at
            or self.role is Role.LEADER
            or not self.configs.is_newer_than_latest(told)
        ):
            return
        self.removed_at = m.removed_at
        self._become_follower(self.term, None)
        self._notices.append(
            f"{self.id} is not in the group's configuration committed at index {m.removed_at} "
            f"(so says {m.voter}): it stops campaigning until a leader contacts it"
        )

    def _log_up_to_date(self, last: EntryId) -> bool:
        mine = self.view.last_id()
        return (last.term, last.index) >= (mine.term, mine.index)

    def _on_request_vote(self, m: RequestVote) -> None:
        if m.pre_vote:
            grant = (
                m.term > self.term
                and (m.transfer or not self._in_lease())
                and self._log_up_to_date(m.last_log)
            )
            reply_term = m.term if grant else self.term
            self._send(m.candidate, RequestVoteReply(reply_term, self.id, grant, True))
            return
        can_vote = self.vote == m.candidate or (self.vote is None and self.leader is None)
        if can_vote and self._log_up_to_date(m.last_log):
            self.vote = m.candidate
            self._hs_dirty = True
            self.election_elapsed = 0
            reply = RequestVoteReply(self.term, self.id, True, False)
            self._send_after_persist(m.candidate, reply, 0)
        else:
            self._send(m.candidate, RequestVoteReply(self.term, self.id, False, False))

    def _vote_reply_counts(self, m: RequestVoteReply) -> bool:
        """Only answers to this very campaign count: pre-vote answers for the term we would
        campaign in while pre-candidate, real votes of our current term while candidate."""
        if self.role is Role.PRE_CANDIDATE:
            # a grant names the term we would campaign in; a refusal names the voter's term
            return m.pre_vote and m.term == (self.term + 1 if m.granted else self.term)
        if self.role is Role.CANDIDATE:
            return not m.pre_vote and m.term == self.term
        return False

    def _on_vote_reply(self, m: RequestVoteReply) -> None:
        if self.role not in (Role.PRE_CANDIDATE, Role.CANDIDATE) or not self._vote_reply_counts(m):
            return
        voters = self.membership.voters
        if m.voter not in voters:
            return
        self.votes.setdefault(m.voter, m.granted)
        granted = sum(1 for v, ok in self.votes.items() if ok and v in voters)
        rejected = sum(1 for v, ok in self.votes.items() if not ok and v in voters)
        quorum = self.membership.quorum
        if granted >= quorum:
            self._election_won(self.role is Role.PRE_CANDIDATE)
        elif rejected > len(voters) - quorum:
            self._become_follower(self.term, None)

    def _heard_from_leader(self, leader: NodeId) -> None:
        assert self.role is not Role.LEADER, f"{self.id}: two leaders in term {self.term}"
        if self.role is not Role.FOLLOWER:
            self._become_follower(self.term, leader)
        self.leader = leader
        self.removed_at = 0  # a leader counts us in
        self.election_elapsed = 0

    def _on_append_entries(self, m: AppendEntries) -> None:
        self._heard_from_leader(m.leader)
        prev, batch = m.prev, m.entries
        if prev.index < self.commit_index:
            # Entries through our commit index match the leader's log: skip them.
            batch = batch.slice(self.commit_index + 1, batch.last_index)
            prev = EntryId(self.commit_index, self.view.term_at(self.commit_index))
        last = self.view.last_index()
        if prev.index > last:
            hint = EntryId(last + 1, 0)
            self._send(m.leader, AppendEntriesReply(self.term, self.id, False, 0, prev.index, hint))
            return
        prev_term = self.view.term_at(prev.index)
        if prev_term != prev.term:
            hint = EntryId(self.view.first_index_of_term(prev_term, prev.index), prev_term)
            self._send(m.leader, AppendEntriesReply(self.term, self.id, False, 0, prev.index, hint))
            return
        if len(batch):
            self._merge(batch)
            match = batch.last_index
        else:
            match = prev.index
        self._advance_follower_commit(min(m.commit, match))
        reply = AppendEntriesReply(self.term, self.id, True, match)
        self._send_after_persist(m.leader, reply, match)

    def _merge(self, batch: EntryBatch) -> None:
        """Append what is new in `batch`, first cutting our suffix where it conflicts."""
        overlap_end = min(self.view.last_index(), batch.last_index)
        if overlap_end < batch.first_index:
            self._append(batch)
            return
        if self.view.term_at(overlap_end) == batch.term_at(overlap_end):
            first_new = overlap_end + 1  # log matching: everything before matches too
        else:
            lo, hi = batch.first_index, overlap_end  # the first mismatch lies in [lo, hi]
            while lo < hi:
                mid = (lo + hi) // 2
                if self.view.term_at(mid) == batch.term_at(mid):
                    lo = mid + 1
                else:
                    hi = mid
            self._truncate_after(lo - 1)
            first_new = lo
        if first_new <= batch.last_index:
            self._append(batch.slice(first_new, batch.last_index))

    def _advance_follower_commit(self, commit: int) -> None:
        if commit > self.commit_index:
            self.commit_index = min(commit, self.view.last_index())
            self._collapse_configs()

    def _on_heartbeat(self, m: Heartbeat) -> None:
        self._heard_from_leader(m.leader)
        self._advance_follower_commit(m.commit)
        self._send(m.leader, HeartbeatReply(self.term, self.id, self.view.last_index()))

    def _on_install_log_start(self, m: InstallLogStart) -> None:
        self._heard_from_leader(m.leader)
        prev = m.start.prev
        if prev.index <= self.commit_index:
            match = self.commit_index  # we already hold everything before the leader's start
        elif prev.index <= self.view.last_index() and self.view.term_at(prev.index) == prev.term:
            match = prev.index
        else:
            self._reset(m.start, m.config)
            self.commit_index = prev.index
            match = prev.index
        self._advance_follower_commit(min(m.commit, match))
        self._send_after_persist(
            m.leader, AppendEntriesReply(self.term, self.id, True, match), match
        )

    def _on_timeout_now(self, m: TimeoutNow) -> None:
        self._heard_from_leader(m.leader)
        if self._promotable():
            self._campaign(pre_vote=False, transfer=True)

    # --- leader: replication and commit ---------------------------------------------------------

    def _broadcast_append(self) -> None:
        assert self.lead is not None
        for peer in self.lead.progress:
            self._send_append(peer)

    def _send_append(self, peer: NodeId, *, probe_gap: bool = False) -> None:
        """Send `peer` what it lacks, as far as its window allows (several batches when
        replicating, one probe otherwise). With `probe_gap`, a follower that seems to have
        everything sent still gets an empty AppendEntries at next - 1: if a batch was lost,
        its rejection exposes the gap, which nothing else would when no new entries come."""
        lead = self.lead
        assert lead is not None
        pr = lead.progress[peer]
        start = self.view.start()
        last = self.view.last_index()
        while pr.can_send():
            if pr.next - 1 < start.prev.index:
                config = self.configs.at(start.prev.index)
                message = InstallLogStart(self.term, self.id, start, self.commit_index, config)
                self._send(peer, message)
                pr.become_reset()
                return
            if pr.state is ProgressState.REPLICATE and pr.next > last and not probe_gap:
                return
            prev_index = pr.next - 1
            prev = EntryId(prev_index, self.view.term_at(prev_index))
            if pr.next <= last:
                batch = self.view.read(
                    pr.next,
                    last,
                    entries_max=self.cfg.append_batch_entries_max,
                    bytes_max=self.cfg.append_batch_bytes_max,
                )
            else:
                batch = empty_batch(pr.next)
            self._send(peer, AppendEntries(self.term, self.id, prev, batch, self.commit_index))
            pr.sent(batch.last_index)
            if not len(batch):
                return

    def _on_append_reply(self, m: AppendEntriesReply) -> None:
        lead = self.lead
        if lead is None:
            return
        pr = lead.progress.get(m.follower)
        if pr is None:
            return
        pr.recent_active = True
        if m.success:
            moved = pr.acked(m.match_index)
            if pr.state is not ProgressState.REPLICATE:
                pr.become_replicate()
            if moved:
                self._maybe_commit()
            if self.lead is None:
                return  # the commit removed us from the configuration
            if lead.transfer_target == m.follower and pr.match == self.view.last_index():
                self._send(m.follower, TimeoutNow(self.term, self.id))
            self._send_append(m.follower)
            return
        hint = m.hint
        lost_entries = (
            hint is not None
            and hint.term == 0
            and hint.index <= pr.match
            and m.reject_index == pr.next - 1  # an answer to what we last sent, not an old one
        )
        if lost_entries:
            assert hint is not None
            self._follower_lost_entries(m.follower, pr, hint.index - 1)
        elif pr.state is ProgressState.REPLICATE and m.reject_index <= pr.match:
            return  # stale: we already know it matches further
        elif pr.state is not ProgressState.REPLICATE and m.reject_index != pr.next - 1:
            return  # stale: an answer to an older probe
        pr.become_probe()
        pr.next = max(pr.match + 1, min(self._next_after_rejection(m), m.reject_index))
        self._send_append(m.follower)

    def _follower_lost_entries(self, follower: NodeId, pr: Progress, log_end: int) -> None:
        """Its log ends before entries it acknowledged: its store was wiped or damaged. Raft
        assumes that never happens; all we can do is say so and copy the log to it again."""
        self._notices.append(
            f"follower {follower} lost entries it had acknowledged (its log ends at {log_end}, "
            f"it had acknowledged {pr.match}): store wiped? copying the log to it again"
        )
        pr.match = log_end

    def _next_after_rejection(self, m: AppendEntriesReply) -> int:
        hint = m.hint
        if hint is None:
            return m.reject_index
        if hint.term == 0:
            return hint.index  # the follower's log ends before our probe
        upto = min(m.reject_index, self.view.last_index())
        at_most = self.view.last_index_with_term_at_most(hint.term, upto)
        if at_most > self.view.start().prev.index and self.view.term_at(at_most) == hint.term:
            return at_most + 1  # we hold that term too: resume after our last entry of it
        return hint.index

    def _on_heartbeat_reply(self, m: HeartbeatReply) -> None:
        lead = self.lead
        if lead is None:
            return
        pr = lead.progress.get(m.follower)
        if pr is None:
            return
        pr.recent_active = True
        pr.heartbeat_answered()
        if m.log_end < pr.match:
            self._follower_lost_entries(m.follower, pr, m.log_end)
            pr.become_probe()
        if pr.match < self.view.last_index() or pr.state is ProgressState.RESET:
            self._send_append(m.follower, probe_gap=True)

    def _can_commit(self, index: int) -> bool:
        """Section 5.4.2: only an entry of the leader's own term is committed by counting
        replicas; earlier entries commit with it."""
        return self.view.term_at(index) == self.term

    def _maybe_commit(self) -> None:
        lead = self.lead
        assert lead is not None
        membership = self.membership
        own = min(self.durable_index, self.view.last_index())
        matches = [own if v == self.id else lead.progress[v].match for v in membership.voters]
        index = majority_index(matches, membership.quorum)
        if index <= self.commit_index or not self._can_commit(index):
            return
        self.commit_index = index
        self._collapse_configs()
        lead.committed_through(index)
        if self.id not in membership.voters and self.configs.latest.index <= index:
            self._hand_over_after_removal()

    def _hand_over_after_removal(self) -> None:
        """Our own removal committed: step down, and let the most caught-up voter campaign at
        once rather than leave the group leaderless for an election timeout."""
        lead = self.lead
        assert lead is not None
        voters = sorted(self.membership.voters)
        best = max(voters, key=lambda v: (lead.progress[v].match, v)) if voters else None
        if best is not None and lead.progress[best].match == self.view.last_index():
            self._send(best, TimeoutNow(self.term, self.id))
        self._become_follower(self.term, None)
