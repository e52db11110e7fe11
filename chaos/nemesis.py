"""The nemesis: takes faults from a scenario's seeded plan and injects them into a target and
its network, one at a time, each held for its planned time, healed, and followed by a wait
for the cluster to recover (every replica back, caught up, a leader).

History records, all from process "nemesis":
    invoke <f> {"fault": kind, "nodes": [...], "leader": who led, "leader_affected": bool, ...}
    ok     <f> (same value, plus what applying and healing did, and applied_ns: when the
           fault was in force, e.g. after the last iptables rule)   when the fault is undone
    invoke recover {"fault": kind}, then ok (or info when the deadline passed) with the time
    it took and what restarted stores said about their tails.
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable, Iterator
from functools import partial
from typing import Any, Protocol

import attrs
import trio

from chaos import partition as plans
from chaos.history import NEMESIS, HistoryWriter, Phase
from chaos.schedule import QUIET_S_MIN, WARMUP_S, PlannedFault
from chaos.targets.base import Target
from chaos.targets.dledger_disk import MODES

LEADER_WAIT_S = 5.0  # a fault aimed at the leader waits this long for one
RECOVERY_TIMEOUT_S = 30.0  # a cluster not recovered by then is reported, and the run goes on
RECOVERY_S_ESTIMATE = 3.0  # a fault is not started unless it can heal and recover in time

Action = Callable[[], Awaitable[dict[str, Any]]]  # does it; returns what to add to the record


@attrs.frozen
class Injection:
    """A fault decided but not yet done: recorded first, then applied, so that the recorded
    start never comes after the fault took effect (failover is never under-measured)."""

    nodes: list[str]  # the nodes the fault is about: killed, paused, cut off, damaged
    leader_affected: bool  # the leader, or its quorum, is lost until a new election or heal
    apply: Action
    heal: Action
    detail: dict[str, Any] = attrs.field(factory=dict)  # e.g. the partition's drops


class Links(Protocol):
    """What the nemesis needs of the network (chaos.net.Network)."""

    async def apply(self, partition: plans.Partition) -> None: ...

    async def heal(self) -> None: ...


async def run_schedule(
    history: HistoryWriter,
    faults: Iterator[PlannedFault],
    until_s: float,
    execute: Callable[[PlannedFault], Awaitable[None]],
) -> None:
    """Execute planned faults, each from its planned start (or a quiet gap after the last
    recovery), until `until_s` (run clock) would be passed."""
    clock = history.clock
    await trio.sleep(WARMUP_S)
    for fault in faults:
        start_s = clock.elapsed_s()
        if start_s + fault.hold_s + RECOVERY_S_ESTIMATE > until_s:
            return
        await execute(fault)
        next_s = max(start_s + fault.interval_s, clock.elapsed_s() + QUIET_S_MIN)
        if next_s >= until_s:
            return
        await trio.sleep(next_s - clock.elapsed_s())


class Nemesis:
    def __init__(
        self,
        target: Target,
        network: Links,
        history: HistoryWriter,
        faults: Iterator[PlannedFault],
        scope: dict[str, Any] | None = None,
    ) -> None:
        """`scope` goes into every fault's record (the broker target names the group)."""
        self.target = target
        self.network = network
        self.history = history
        self.faults = faults
        self.scope = dict(scope or {})
        self.current: str | None = None  # for the progress line
        self.injected = 0
        self.not_recovered = 0

    @property
    def nodes(self) -> list[str]:
        return list(self.target.nodes)

    async def run(self, until_s: float) -> None:
        """Inject faults until `until_s` (run clock) would be passed; all healed on return."""
        await run_schedule(self.history, self.faults, until_s, self.execute)

    async def execute(self, fault: PlannedFault) -> None:
        rng = random.Random(fault.seed)
        leader = await self.target.wait_leader(LEADER_WAIT_S)
        injection = self._planners[fault.kind](rng, leader)
        f = fault.spec.f
        value: dict[str, Any] = {
            "fault": fault.kind,
            **self.scope,
            "number": fault.number,
            "leader": leader,
            "leader_affected": injection.leader_affected,
            "nodes": injection.nodes,
            **injection.detail,
        }
        self.history.record(NEMESIS, Phase.INVOKE, f, value)
        self.injected += 1
        self.current = f"{fault.kind} {','.join(injection.nodes)}"
        try:
            value = {**value, **await injection.apply()}
            value["applied_ns"] = self.history.clock.now_ns()  # in force from here on
            await trio.sleep(fault.hold_s)
            value = {**value, **await injection.heal()}
        except BaseException as err:  # the run was stopped, or a tool failed: say so, go on up
            why = "the run was stopped" if isinstance(err, trio.Cancelled) else repr(err)
            self.history.record(NEMESIS, Phase.INFO, f, value, error=why)
            raise
        self.history.record(NEMESIS, Phase.OK, f, value)
        self.current = f"recovering from {fault.kind}"
        await self._recover(fault, value)
        self.current = None

    async def _recover(self, fault: PlannedFault, value: dict[str, Any]) -> None:
        clock = self.history.clock
        self.history.record(NEMESIS, Phase.INVOKE, "recover", {"fault": fault.kind, **self.scope})
        began = clock.now_ns()
        try:
            recovered = await self.target.wait_recovered(RECOVERY_TIMEOUT_S)
        except trio.Cancelled:
            self.history.record(
                NEMESIS,
                Phase.INFO,
                "recover",
                {"fault": fault.kind, **self.scope},
                error="the run was stopped",
            )
            raise
        result: dict[str, Any] = {
            "fault": fault.kind,
            **self.scope,
            "ms": (clock.now_ns() - began) // 10**6,
        }
        restarted = value.get("restarted", [])
        if restarted:
            result["store_recovery"] = {n: self.target.recovery_note(n) for n in restarted}
        if recovered:
            self.history.record(NEMESIS, Phase.OK, "recover", result)
        else:
            self.not_recovered += 1
            self.history.record(
                NEMESIS,
                Phase.INFO,
                "recover",
                result,
                error=f"not recovered within {RECOVERY_TIMEOUT_S} s",
            )

    # --- faults: each decides what to do (pure but for the choice of victims) -----------------

    @property
    def _planners(self) -> dict[str, Callable[[random.Random, str | None], Injection]]:
        return {
            "kill-leader": lambda rng, leader: self._kill(
                [self._leader_or_any(rng, leader)], leader is not None
            ),
            "kill-follower": lambda rng, leader: self._kill(
                [rng.choice(self._followers(leader))], False
            ),
            # killed or not, the leader has no quorum until the restart
            "kill-majority": lambda rng, leader: self._kill(
                sorted(rng.sample(self.nodes, len(self.nodes) // 2 + 1)), True
            ),
            "group-restart": lambda rng, leader: self._kill(
                rng.sample(self.nodes, len(self.nodes)), True
            ),
            "disk-tail": self._disk_tail,
            "pause-leader": lambda rng, leader: self._pause(
                self._leader_or_any(rng, leader), leader is not None
            ),
            "pause-follower": lambda rng, leader: self._pause(
                rng.choice(self._followers(leader)), False
            ),
            "partition-leader": lambda rng, leader: self._partition(
                plans.isolate(self.nodes, self._leader_or_any(rng, leader)), leader
            ),
            "partition-halves": lambda rng, leader: self._partition(
                plans.halves(self.nodes, rng), leader
            ),
            "partition-bridge": lambda rng, leader: self._partition(
                plans.bridge(self.nodes, rng), leader
            ),
            "partition-oneway": lambda rng, leader: self._partition(
                plans.one_way(self.nodes, self._leader_or_any(rng, leader)), leader, one_way=True
            ),
        }

    def _leader_or_any(self, rng: random.Random, leader: str | None) -> str:
        return leader if leader is not None else rng.choice(self.nodes)

    def _followers(self, leader: str | None) -> list[str]:
        return [n for n in self.nodes if n != leader]

    def _kill(self, victims: list[str], leader_affected: bool) -> Injection:
        async def apply() -> dict[str, Any]:
            for node in victims:
                self.target.kill(node)
            return {}

        async def heal() -> dict[str, Any]:
            for node in victims:
                self.target.start(node)
            return {"restarted": victims}

        return Injection(victims, leader_affected, apply, heal)

    def _disk_tail(self, rng: random.Random, leader: str | None) -> Injection:
        victim = rng.choice(self.nodes)
        mode = rng.choice(MODES)
        killing = self._kill([victim], victim == leader)

        async def apply() -> dict[str, Any]:
            await killing.apply()
            # file I/O of up to a segment: off the event loop, which the clients share
            damage = partial(self.target.damage_tail, victim, mode, rng)
            return {"damage": await trio.to_thread.run_sync(damage)}

        return attrs.evolve(killing, apply=apply)

    def _pause(self, victim: str, leader_affected: bool) -> Injection:
        async def apply() -> dict[str, Any]:
            self.target.pause(victim)
            return {}

        async def heal() -> dict[str, Any]:
            self.target.resume(victim)
            return {"resumed": [victim]}

        return Injection([victim], leader_affected, apply, heal)

    def _partition(
        self, cut: plans.Partition, leader: str | None, *, one_way: bool = False
    ) -> Injection:
        """The nodes it is about are its first component: the isolated node, the minority,
        one side of a bridge, the source of one-way loss."""
        if one_way:
            affected = leader is not None  # the leader is the one that cannot be heard
        else:
            affected = leader is not None and not plans.in_majority(cut, leader, self.nodes)

        async def apply() -> dict[str, Any]:
            await self.network.apply(cut)
            return {}

        async def heal() -> dict[str, Any]:
            await self.network.heal()
            return {"healed": True}

        return Injection(list(cut.components[0]), affected, apply, heal, cut.describe())
