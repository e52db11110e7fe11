"""A hand-driven cluster for scenario tests: the simulator's world with faults off and the
test choosing which message arrives when. Every step still runs the safety checks, so a
scenario that breaks a property raises `Violation` at the step that broke it."""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from dledger.raft.config import RaftConfig
from dledger.raft.core import RaftCore
from dledger.raft.entries import EntryBatch, EntryKind
from dledger.raft.events import Effects, HardState, Persist, Propose, Role, Tick
from dledger.raft.messages import Message
from dledger.raft.sim.memlog import MemLog
from dledger.raft.sim.network import Packet
from dledger.raft.sim.world import SIM_CONFIG, CoreFactory, Faults, SimNode, World

SCRIPT_CONFIG = attrs.evolve(SIM_CONFIG, append_batch_entries_max=1024)


def payload(index: int, term: int) -> bytes:
    """The payload scenario logs use, so equal (index, term) means equal entries."""
    return f"{index}/{term}".encode()


def memlog_with_terms(terms: Sequence[int]) -> MemLog:
    log = MemLog()
    if terms:
        batch = EntryBatch(
            1,
            list(terms),
            [EntryKind.DATA.value] * len(terms),
            [payload(i + 1, t) for i, t in enumerate(terms)],
        )
        log.write(Persist(append=batch))
        log.fsync()
    return log


class Script:
    def __init__(
        self,
        nodes: int = 3,
        *,
        core: CoreFactory = RaftCore,
        config: RaftConfig = SCRIPT_CONFIG,
        auto_flush: bool = True,
        spares: int = 0,
    ) -> None:
        self.world = World(
            0,
            nodes=nodes,
            faults=Faults.none(),
            config=config,
            core_factory=core,
            spares=spares,
            propose_rate=0,
        )
        self.auto_flush = auto_flush

    # --- nodes ------------------------------------------------------------------------------

    def node(self, name: str) -> SimNode:
        return self.world.nodes[name]

    def core(self, name: str) -> RaftCore:
        c = self.node(name).core
        assert c is not None, f"{name} is down"
        return c

    def terms(self, name: str) -> list[int]:
        log = self.node(name).log
        return [log.term_at(i) for i in range(log.start.prev.index + 1, log.last_index + 1)]

    def set_log(self, name: str, terms: Sequence[int], current_term: int) -> None:
        """Give a node a log and a term, as if it had lived through earlier terms."""
        node = self.node(name)
        node.log = memlog_with_terms(terms)
        node.hard = HardState(term=current_term)
        for i, t in enumerate(terms):
            self.world.checker.entries_seen.setdefault(
                (i + 1, t), (payload(i + 1, t), terms[i - 1] if i else 0)
            )
        self.world.restart(node)

    # --- events -----------------------------------------------------------------------------

    def feed(self, name: str, event: object) -> None:
        self.world.feed(self.node(name), event)  # type: ignore[arg-type]
        self._after()

    def _after(self) -> None:
        if self.auto_flush:
            for node in self.world.nodes.values():
                if node.alive and node.log.dirty:
                    self.world.flush(node)

    def tick(self, name: str, ticks: int = 1) -> None:
        for _ in range(ticks):
            self.feed(name, Tick())

    def campaign(self, name: str) -> None:
        """Let the node's election timeout run out."""
        core = self.core(name)
        core.election_elapsed = core.randomized_timeout - 1
        self.node(name).quiet = (None, 0)  # what the core said of its ticks no longer holds
        self.tick(name)

    def elect(self, name: str) -> None:
        self.campaign(name)
        self.stabilize()
        assert self.core(name).role is Role.LEADER, self.core(name).role

    def propose(self, name: str, *payloads: bytes) -> Effects:
        core = self.core(name)
        fx = core.step(Propose(list(payloads)))
        self.world._perform(self.node(name), fx)
        self._after()
        return fx

    def crash(self, name: str) -> None:
        self.world.crash(self.node(name))

    def restart(self, name: str) -> None:
        self.world.restart(self.node(name))

    # --- the network --------------------------------------------------------------------------

    def pending(
        self, src: str | None = None, dst: str | None = None, kind: type | None = None
    ) -> list[Packet]:
        return [p for p in self.world.net.in_flight if _matches(p, src, dst, kind)]

    def deliver(
        self,
        src: str | None = None,
        dst: str | None = None,
        kind: type | None = None,
        limit: int | None = None,
    ) -> int:
        """Deliver matching messages in the order they were sent (not those their delivery
        sends); returns how many arrived."""
        chosen = self.pending(src, dst, kind)[:limit]
        for packet in chosen:
            self.world.net.in_flight.remove(packet)
        for packet in chosen:
            node = self.node(packet.dst)
            if node.alive:
                self.feed(packet.dst, packet.message)
        return len(chosen)

    def drop(self, src: str | None = None, dst: str | None = None, kind: type | None = None) -> int:
        chosen = self.pending(src, dst, kind)
        for packet in chosen:
            self.world.net.in_flight.remove(packet)
        return len(chosen)

    def stabilize(self, rounds_max: int = 200, *, cut_off: str | None = None) -> None:
        """Deliver until nothing is in flight; messages to and from `cut_off` are lost."""
        for _ in range(rounds_max):
            if cut_off is not None:
                self.drop(src=cut_off)
                self.drop(dst=cut_off)
            if not self.deliver():
                return
        raise AssertionError(f"still delivering after {rounds_max} rounds")

    def heartbeats(self, leader: str, rounds: int, *, cut_off: str | None = None) -> None:
        """`rounds` heartbeat periods of the leader, each followed by stabilize()."""
        for _ in range(rounds):
            self.tick(leader, self.world.config.heartbeat_ticks)
            self.stabilize(cut_off=cut_off)


def _matches(p: Packet, src: str | None, dst: str | None, kind: type | None) -> bool:
    m: Message = p.message
    return (
        (src is None or p.src == src)
        and (dst is None or p.dst == dst)
        and (kind is None or isinstance(m, kind))
    )
