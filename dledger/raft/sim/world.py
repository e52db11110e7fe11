"""A world of simulated nodes driven by one seeded RNG: the only source of chance.

A node here does what `dledger.Node` does with real files and sockets, in the same order
(see the contract in dledger/raft/events.py): send, persist, hold promises until the log is
durable, report durability, apply. Faults: the network's (network.py), crashes that lose
whatever was not fsynced, restarts, partitions, dropped connections, leadership transfers,
membership changes and log compaction.
"""

from __future__ import annotations

import random
from collections import Counter, deque
from collections.abc import Callable

import attrs

from dledger.raft.config import RaftConfig
from dledger.raft.core import RaftCore
from dledger.raft.entries import EntryId, NodeId
from dledger.raft.events import (
    NO_EFFECTS,
    ChangeMembership,
    Effects,
    Event,
    HardState,
    PeerDisconnected,
    Propose,
    Proposed,
    Role,
    Tick,
    TransferLeadership,
)
from dledger.raft.membership import ChangeKind, Membership
from dledger.raft.messages import Envelope, Message, RequestVoteReply
from dledger.raft.promises import Promises
from dledger.raft.sim import network as net
from dledger.raft.sim.invariants import Checker
from dledger.raft.sim.memlog import MemLog

CoreFactory = Callable[..., RaftCore]

# Timing for the simulator: small numbers keep runs short; relations as in production.
SIM_CONFIG = RaftConfig(
    heartbeat_ticks=2,
    election_ticks_min=10,
    election_ticks_max=20,
    leader_lost_stagger_ticks=2,
    transfer_ticks_max=10,
    inflight_max=4,
    append_batch_entries_max=16,
)
TRACE_LINES = 400


@attrs.frozen
class Faults:
    """How often each kind of fault strikes, per tick; `network` applies to every message."""

    network: net.NetworkFaults = net.FAULTY
    crash: float = 0.015
    bounce: float = 0.005  # a crash and an immediate restart (a supervisor restarts the process)
    restart: float = 0.08
    partition: float = 0.01
    heal: float = 0.05
    disconnect: float = 0.005  # a connection resets while both ends live
    transfer: float = 0.004
    membership: float = 0.004
    compact: float = 0.01
    flush_lag: float = 0.5  # chance a due fsync waits another step
    partition_kinds: tuple[str, ...] = ("halves", "isolate-leader", "bridge", "one-way")
    buggify: float = 0.02  # chance of a crash at an interesting moment (FoundationDB's
    # "buggify"): a leader just after its disk took entries no one else has yet, a voter just
    # after granting its vote
    crash_loses_messages: float = 0.5  # chance each message to or from a crashing node is lost
    # (still in a socket buffer); the rest arrive, at the new incarnation if it restarts quickly
    crash_noticed: float = 0.8  # chance a peer sees the crashed node's connection drop (no FIN
    # arrives when a machine loses power, only when a process dies)

    @classmethod
    def swarm(cls, rng: random.Random, buggify: tuple[float, float] | None = None) -> Faults:
        """A fault mix of its own for one seed (swarm testing): every rate drawn at random and
        about a third of the fault kinds switched off, so runs differ in kind, not only in luck.
        Uniform mixes keep every fault rare; skewed ones reach stranger interleavings.
        `buggify` forces that rate into a range (searches for a known kind of bug use it)."""

        def rate(high: float) -> float:
            return 0.0 if rng.random() < 0.35 else rng.uniform(0, high)

        network = net.NetworkFaults(
            drop=rate(0.2),
            duplicate=rate(0.1),
            delay_ticks_max=rng.choice([0, 1, 2, 4]),
            long_delay=rate(0.1),
        )
        return cls(
            network=network,
            crash=rate(0.06),
            bounce=rate(0.03),
            restart=rng.uniform(0.02, 0.3),
            partition=rate(0.05),
            heal=rng.uniform(0.02, 0.2),
            disconnect=rate(0.02),
            transfer=rate(0.02),
            membership=rate(0.01),
            compact=rate(0.03),
            flush_lag=rng.uniform(0.0, 0.9),
            buggify=rate(0.3) if buggify is None else rng.uniform(*buggify),
            crash_loses_messages=rng.uniform(0.0, 1.0),
            crash_noticed=rng.choice([0.0, 0.5, 1.0]),
        )

    @classmethod
    def none(cls) -> Faults:
        return cls(net.CLEAN, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0.0, (), 0.0, 0.0, 1.0)


ALL_FAULTS = Faults()


@attrs.define
class SimNode:
    id: NodeId
    log: MemLog
    hard: HardState  # what is durable
    core: RaftCore | None = None  # None while crashed
    held: Promises = attrs.field(factory=Promises)
    applied: int = 0
    checkpoint: int = 0  # the applied index last written to the checkpoint file
    incarnation: int = 0
    commit_seen: int = 0  # the commit index this incarnation last reported
    # what the core said of the Ticks to come after its last step (RaftCore.quiet_ticks)
    quiet: tuple[RaftCore | None, int] = (None, 0)

    @property
    def alive(self) -> bool:
        return self.core is not None


class World:
    def __init__(
        self,
        seed: int,
        *,
        nodes: int = 3,
        faults: Faults | None = ALL_FAULTS,
        config: RaftConfig = SIM_CONFIG,
        core_factory: CoreFactory = RaftCore,
        spares: int = 1,
        propose_rate: float = 0.3,
    ) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.faults = faults if faults is not None else Faults.swarm(self.rng)
        self.config = config
        self.core_factory = core_factory
        self.propose_rate = propose_rate
        self.net = net.Network(random.Random(self.rng.getrandbits(64)), self.faults.network)
        self.ids = [f"n{i}" for i in range(nodes + spares)]
        self.initial = Membership(frozenset(self.ids[:nodes]))
        self.nodes = {i: SimNode(i, MemLog(), HardState()) for i in self.ids}
        self.checker = Checker(self.initial)
        self.now = 0
        self.steps = 0
        self.values_proposed = 0
        self.trace: deque[tuple[object, ...]] = deque(maxlen=TRACE_LINES)
        self.stats: Counter[str] = Counter()  # faults injected and rare paths taken
        self.notices: list[tuple[NodeId, str]] = []  # what the cores asked an operator to read
        self.disk_epoch = 0  # bumped whenever any simulated disk changes
        self._checked: tuple[int, EntryId | None] = (-1, None)
        for node in self.nodes.values():
            self._start(node)

    # --- running ----------------------------------------------------------------------------

    def step(self) -> None:
        """One action: deliver a due message (in random order), finish an fsync, or let a tick
        pass. Due messages usually go before time moves on, so the network keeps up; now and
        then a tick or fsync jumps the queue, which is how slow links and disks look."""
        self.steps += 1
        ready = self.net.ready(self.now)
        r = self.rng.random()
        if ready and r < 0.95:
            self._deliver(self.rng.choice(ready))
        else:
            dirty = [n for n in self.nodes.values() if n.alive and n.log.dirty]
            if dirty and self.rng.random() >= self.faults.flush_lag:
                self.flush(self.rng.choice(dirty))
            else:
                self._advance_time()
        # Which disks hold the newest committed entry changes only when a disk or the commit
        # does; checking then is checking after every step.
        key = (self.disk_epoch, self.checker.committed_top)
        if key != self._checked:
            self._checked = key
            self.checker.on_step(self._holders())

    def run_until(self, done: Callable[[], bool], ticks_max: int) -> bool:
        deadline = self.now + ticks_max
        while self.now < deadline:
            if done():
                return True
            self.step()
        return done()

    def heal(self) -> None:
        """Faults off: network clean and whole, every node up, everything flushed promptly."""
        self.faults = attrs.evolve(Faults.none())
        self.net.faults = net.CLEAN
        self.net.cut = frozenset()
        self._trace("heal all")
        for node in self.nodes.values():
            if not node.alive:
                self.restart(node)

    # --- liveness -----------------------------------------------------------------------------

    def leader(self) -> SimNode | None:
        """The live leader of the highest term, unless a member of its own configuration is in
        a later term (then it is about to step down).

        Nodes outside that configuration do not count: a voter removed while it was down can
        sit in a later term for good (it stops campaigning once a voter tells it it is out,
        but keeps its term), while the group commits without it."""
        live = [n for n in self.nodes.values() if n.core is not None]
        leaders = [n for n in live if n.core is not None and n.core.role is Role.LEADER]
        if not leaders:
            return None
        best = max(leaders, key=lambda n: n.core.term if n.core is not None else -1)
        assert best.core is not None
        term, members = best.core.term, best.core.membership.members
        for n in live:
            if n.id in members and n.core is not None and n.core.term > term:
                return None
        return best

    def members(self) -> list[SimNode]:
        leader = self.leader()
        if leader is None or leader.core is None:
            return []
        return [self.nodes[i] for i in sorted(leader.core.membership.members)]

    def commit_new_entry(self, ticks_max: int) -> bool:
        """Liveness: propose a marker at the leader; done when every member applied it."""
        marker = f"liveness-{self.seed}".encode()
        state: dict[str, EntryId] = {}

        def done() -> bool:
            leader = self.leader()
            if leader is None or leader.core is None:
                state.clear()
                return False
            if not state:
                fx = leader.core.step(Propose([marker]))
                self._perform(leader, fx)
                if isinstance(fx.result, Proposed):
                    state["entry"] = EntryId(fx.result.last, fx.result.term)
                return False
            entry = state["entry"]
            for member in self.members():
                if member.applied < entry.index or member.core is None:
                    return False
                if member.log.start.prev.index < entry.index and (
                    member.log.term_at(entry.index) != entry.term
                ):
                    state.clear()  # superseded by a later leader: propose again
                    return False
            return True

        return self.run_until(done, ticks_max)

    # --- what a node does ---------------------------------------------------------------------

    def _start(self, node: SimNode) -> None:
        node.incarnation += 1
        node.commit_seen = 0
        node.core = self.core_factory(
            node.id,
            self.config,
            node.log,
            node.hard,
            initial_membership=self.initial,
            rng=random.Random(self.rng.getrandbits(64)),
            commit_index=node.checkpoint,
        )
        node.applied = max(node.checkpoint, node.log.start.prev.index)

    def feed(self, node: SimNode, event: Event | Message) -> None:
        assert node.core is not None
        core, removed_before = node.core, node.core.removed_at
        quiet_core, quiet = node.quiet
        fx = core.step(event)
        if quiet and quiet_core is core and isinstance(event, Tick):
            # a Tick the core called quiet does nothing: a node may sleep through it
            assert fx is NO_EFFECTS, (node.id, quiet, fx)
            node.quiet = (core, quiet - 1)
            self.stats["quiet tick"] += 1
        else:
            node.quiet = (core, core.quiet_ticks())
        self._perform(node, fx)
        if node.core.removed_at and not removed_before:
            self.stats["told removed"] += 1  # a voter removed while down learned of it
        if any(
            isinstance(env.message, RequestVoteReply) and env.message.granted
            for env in fx.send_after_persist
        ):
            self._buggify(node)  # a vote forgotten across a restart would show now

    def _buggify(self, node: SimNode) -> None:
        """A fault at an interesting moment (FoundationDB's "buggify"): uniform faults rarely
        strike exactly between two steps that must not be separated."""
        if self.faults.buggify and self.rng.random() < self.faults.buggify:
            self._trace(node.id, "buggify")
            self.stats["buggify"] += 1
            self.crash(node)
            if self.rng.random() < 0.5:
                self.restart(node)

    def _perform(self, node: SimNode, fx: Effects) -> None:
        core = node.core
        assert core is not None
        for notice in fx.notices:
            self.notices.append((node.id, notice))
            self._trace(node.id, "notice:", notice)
        for env in fx.send_now:
            self.net.send(node.id, env.to, env.message, self.now)
        if fx.persist is not None:
            p = fx.persist
            if p.hard_state is not None:
                node.hard = p.hard_state  # the node fsyncs it before going on
            node.held.log_changed(p)
            node.log.write(p)
            if p.reset is not None:
                self.disk_epoch += 1
                self.stats["log reset"] += 1
            if p.truncate_after is not None:
                self.stats["truncation"] += 1
            if p.append is not None and len(p.append):
                prev_term = node.log.term_at(p.append.first_index - 1)
                self.checker.on_persist(node.id, p.append, prev_term)
        if fx.send_after_persist:
            ready = node.held.hold(fx.sync_through, fx.send_after_persist, node.log.durable_index)
            self._send(node, ready)
        if fx.role is not None:
            self._trace(node.id, "role", fx.role.role.value, fx.role.term, fx.role.leader)
            if fx.role.role is Role.LEADER:
                self.stats["election"] += 1
                self.checker.on_leader(node.id, fx.role.term)
                top = self.checker.committed_before(fx.role.term)
                if top is not None:
                    has = node.log.start.prev.index >= top.index or (
                        top.index <= node.log.last_index and node.log.term_at(top.index) == top.term
                    )
                    self.checker.on_leader_log(node.id, fx.role.term, has, top)
        if fx.commit_index is not None:
            self._record_commit(node, fx.commit_index)
            self._apply(node)

    def _record_commit(self, node: SimNode, commit: int) -> None:
        log = node.log
        seen = node.commit_seen
        first = max(seen + 1, log.start.prev.index + 1)
        terms = [log.term_at(i) for i in range(first, commit + 1)]
        kinds = [log.kind_at(i) for i in range(first, commit + 1)]
        payloads = [log.payload_at(i) for i in range(first, commit + 1)]
        core = node.core
        assert core is not None
        # Only a leader commits an index first (followers learn it), so when this advances
        # the global commit, core.membership is the configuration whose quorum counted.
        membership = core.membership
        self.checker.on_commit(
            node.id, seen, commit, first, terms, kinds, payloads, membership, core.term
        )
        node.commit_seen = commit

    def _apply(self, node: SimNode) -> None:
        core = node.core
        assert core is not None
        log = node.log
        upto = min(core.commit_index, log.durable_index)
        if node.applied < log.start.prev.index:
            node.applied = log.start.prev.index  # a reset skipped entries (DLedger's way)
        while node.applied < upto:
            i = node.applied + 1
            self.checker.on_apply(node.id, i, log.term_at(i), log.payload_at(i))
            node.applied = i

    def _send(self, node: SimNode, envelopes: list[Envelope]) -> None:
        for env in envelopes:
            self.net.send(node.id, env.to, env.message, self.now)

    def flush(self, node: SimNode) -> None:
        through = node.log.fsync()
        self.disk_epoch += 1
        ready, persisted = node.held.durable(through, node.log.start.prev.index)
        self._send(node, ready)
        if persisted is not None:
            self.feed(node, persisted)
        else:
            self._apply(node)
        if self.rng.random() < 0.5:
            node.checkpoint = node.applied
        core = node.core
        if core is not None and core.role is Role.LEADER and core.commit_index < through.index:
            self._buggify(node)  # its new entries are on its disk only: Figure 8's ingredient

    def _deliver(self, position: int) -> None:
        packet = self.net.take(position)
        if packet is None:
            return
        node = self.nodes[packet.dst]
        if node.core is None:
            return
        self._trace(packet.src, "->", packet.dst, packet.message)
        self.feed(node, packet.message)

    # --- time, clients and faults ----------------------------------------------------------

    def _advance_time(self) -> None:
        self.now += 1
        live = [n for n in self.nodes.values() if n.alive]
        self.rng.shuffle(live)
        for node in live:
            if node.alive:
                self.feed(node, Tick())
        if self.propose_rate and self.rng.random() < self.propose_rate:
            self._propose()
        self._maybe_fault()

    def _propose(self) -> None:
        """A client writes to a node that believes it leads (a stale leader too: clients learn
        of a new leader late), or now and then to any node."""
        live = [n for n in self.nodes.values() if n.core is not None]
        if not live:
            return
        leaders = [n for n in live if n.core is not None and n.core.role is Role.LEADER]
        node = self.rng.choice(leaders if leaders and self.rng.random() < 0.8 else live)
        n = self.rng.randint(1, 3)
        payloads = [f"v{self.values_proposed + k}".encode() for k in range(n)]
        self.values_proposed += n
        self.feed(node, Propose(payloads))

    def _maybe_fault(self) -> None:
        f, rng = self.faults, self.rng
        live = [n for n in self.nodes.values() if n.alive]
        down = [n for n in self.nodes.values() if not n.alive]
        if live and rng.random() < f.crash:
            leader = self.leader()  # half the crashes hit the leader: the fault that matters most
            self.crash(leader if leader is not None and rng.random() < 0.5 else rng.choice(live))
        if live and rng.random() < f.bounce:
            node = rng.choice(live)
            if node.alive:
                self.crash(node)
                self.restart(node)
        if down and rng.random() < f.restart:
            self.restart(rng.choice(down))
        if rng.random() < f.partition:
            self._partition()
        if self.net.cut and rng.random() < f.heal:
            self.net.cut = frozenset()
            self._trace("heal partition")
        if live and rng.random() < f.disconnect:
            a, b = rng.sample(self.ids, 2)
            if self.nodes[a].alive:
                self._trace(a, "lost connection to", b)
                self.stats["disconnect"] += 1
                self.feed(self.nodes[a], PeerDisconnected(b))
        if rng.random() < f.transfer:
            self._transfer()
        if rng.random() < f.membership:
            self._change_membership()
        if live and rng.random() < f.compact:
            node = rng.choice(live)
            upto = min(node.applied, node.log.durable_index)
            if upto > node.log.start.prev.index:
                through = rng.randint(node.log.start.prev.index + 1, upto)
                node.log.compact(through)
                self.disk_epoch += 1
                self._trace(node.id, "compacted through", through)
                self.stats["compaction"] += 1

    def crash(self, node: SimNode) -> None:
        self._trace(node.id, "crash")
        self.stats["crash"] += 1
        node.core = None
        node.held.clear()
        node.log.crash(self.rng)
        self.disk_epoch += 1
        self.net.drop_around(node.id, self.faults.crash_loses_messages)
        for other in self.nodes.values():
            if other.alive and self.rng.random() < self.faults.crash_noticed:
                self.feed(other, PeerDisconnected(node.id))

    def restart(self, node: SimNode) -> None:
        self._trace(node.id, "restart")
        self.stats["restart"] += 1
        self._start(node)

    def _partition(self) -> None:
        rng, ids = self.rng, self.ids
        kind = rng.choice(self.faults.partition_kinds)
        if kind == "halves":
            cut = net.random_halves(ids, rng)
        elif kind == "isolate-leader":
            leader = self.leader()
            cut = net.isolate(leader.id if leader else rng.choice(ids), ids)
        elif kind == "bridge":
            cut = net.bridge(ids, rng)
        else:
            cut = net.one_way(*rng.sample(ids, 2))
        self.net.cut = cut
        self.stats[f"partition {kind}"] += 1
        self._trace("partition", kind, sorted(cut))

    def _transfer(self) -> None:
        leader = self.leader()
        if leader is None or leader.core is None:
            return
        target = self.rng.choice(sorted(leader.core.membership.voters))
        self._trace(leader.id, "transfer to", target)
        self.stats["transfer"] += 1
        self.feed(leader, TransferLeadership(target))

    def _change_membership(self) -> None:
        leader = self.leader()
        if leader is None or leader.core is None:
            return
        members = leader.core.membership
        outside = [i for i in self.ids if i not in members.members]
        if outside and self.rng.random() < 0.6:
            change = ChangeMembership(ChangeKind.ADD_VOTER, self.rng.choice(outside))
        elif len(members.voters) > 3:
            victim = self.rng.choice(sorted(members.voters))
            change = ChangeMembership(ChangeKind.REMOVE, victim)
        else:
            return
        self._trace(leader.id, "membership", change.kind.value, change.node)
        self.stats[f"membership {change.kind.value}"] += 1
        self.feed(leader, change)

    def _holders(self) -> list[NodeId]:
        top = self.checker.committed_top
        if top is None:
            return []
        return [n.id for n in self.nodes.values() if n.log.disk_has(top)]

    # --- reporting --------------------------------------------------------------------------

    def _trace(self, *parts: object) -> None:
        self.trace.append((self.now, *parts))

    def format_trace(self, lines: int = 60) -> str:
        out = []
        for now, *parts in list(self.trace)[-lines:]:
            out.append(f"t={now:<5} " + " ".join(_short(p) for p in parts))
        return "\n".join(out)


def _short(part: object) -> str:
    name = type(part).__name__
    if name == "AppendEntries":
        m = part
        n = len(m.entries)  # type: ignore[attr-defined]
        return f"AppendEntries t{m.term} prev={m.prev} n={n} commit={m.commit}"  # type: ignore[attr-defined]
    if name == "AppendEntriesReply":
        m = part
        ok = "ok" if m.success else f"reject@{m.reject_index} hint={m.hint}"  # type: ignore[attr-defined]
        return f"AppendEntriesReply t{m.term} {ok} match={m.match_index}"  # type: ignore[attr-defined]
    return str(part)
