"""The nemesis: takes faults from a scenario's seeded plan and injects them into a target and
its network, one at a time, each held for its planned time, healed, and followed by a wait
for the cluster to recover (every replica back, caught up, a leader).

History records, all from process "nemesis":
    invoke <f> {"fault": kind, "nodes": [...], "leader": who led, "leader_affected": bool, ...}
    ok     <f> (same value, plus what healing did)                 when the fault is undone
    invoke recover {"fault": kind}, then ok (or info when the deadline passed) with the time
    it took and what restarted stores said about their tails.
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import trio

from chaos import partition as plans
from chaos.history import NEMESIS, HistoryWriter, Phase
from chaos.net import Network
from chaos.schedule import QUIET_S_MIN, WARMUP_S, PlannedFault
from chaos.targets.base import Target
from chaos.targets.dledger_disk import MODES

LEADER_WAIT_S = 5.0  # a fault aimed at the leader waits this long for one
RECOVERY_TIMEOUT_S = 30.0  # a cluster not recovered by then is reported, and the run goes on
RECOVERY_S_ESTIMATE = 3.0  # a fault is not started unless it can heal and recover in time

Heal = Callable[[], Awaitable[dict[str, Any]]]


class Nemesis:
    def __init__(
        self,
        target: Target,
        network: Network,
        history: HistoryWriter,
        faults: Iterator[PlannedFault],
    ) -> None:
        self.target = target
        self.network = network
        self.history = history
        self.faults = faults
        self.current: str | None = None  # for the progress line
        self.injected = 0
        self.not_recovered = 0

    @property
    def nodes(self) -> list[str]:
        return list(self.target.nodes)

    async def run(self, until_s: float) -> None:
        """Inject faults until `until_s` (run clock) would be passed; all healed on return."""
        clock = self.history.clock
        await trio.sleep(WARMUP_S)
        for fault in self.faults:
            start_s = clock.elapsed_s()
            if start_s + fault.hold_s + RECOVERY_S_ESTIMATE > until_s:
                return
            await self.execute(fault)
            next_s = max(start_s + fault.interval_s, clock.elapsed_s() + QUIET_S_MIN)
            if next_s >= until_s:
                return
            await trio.sleep(next_s - clock.elapsed_s())

    async def execute(self, fault: PlannedFault) -> None:
        rng = random.Random(fault.seed)
        leader = await self.target.wait_leader(LEADER_WAIT_S)
        inject = getattr(self, "_" + fault.kind.replace("-", "_"))
        f = fault.spec.f
        value: dict[str, Any] = {"fault": fault.kind, "number": fault.number, "leader": leader}
        heal: Heal = await inject(rng, leader, value)
        self.injected += 1
        self.history.record(NEMESIS, Phase.INVOKE, f, value)
        self.current = f"{fault.kind} {','.join(value.get('nodes', []))}"
        try:
            await trio.sleep(fault.hold_s)
            value = {**value, **await heal()}
        except trio.Cancelled:
            self.history.record(NEMESIS, Phase.INFO, f, value, error="the run was stopped")
            raise
        self.history.record(NEMESIS, Phase.OK, f, value)
        self.current = f"recovering from {fault.kind}"
        await self._recover(fault, value)
        self.current = None

    async def _recover(self, fault: PlannedFault, value: dict[str, Any]) -> None:
        clock = self.history.clock
        self.history.record(NEMESIS, Phase.INVOKE, "recover", {"fault": fault.kind})
        began = clock.now_ns()
        try:
            recovered = await self.target.wait_recovered(RECOVERY_TIMEOUT_S)
        except trio.Cancelled:
            self.history.record(
                NEMESIS, Phase.INFO, "recover", {"fault": fault.kind}, error="the run was stopped"
            )
            raise
        result: dict[str, Any] = {"fault": fault.kind, "ms": (clock.now_ns() - began) // 10**6}
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

    # --- faults: each injects, fills in `value`, and returns how to heal -----------------------

    def _leader_or_any(self, rng: random.Random, leader: str | None) -> str:
        return leader if leader is not None else rng.choice(self.nodes)

    def _followers(self, leader: str | None) -> list[str]:
        return [n for n in self.nodes if n != leader]

    async def _kill(self, victims: list[str], value: dict[str, Any]) -> Heal:
        for node in victims:
            self.target.kill(node)
        value["nodes"] = victims

        async def heal() -> dict[str, Any]:
            for node in victims:
                self.target.start(node)
            return {"restarted": victims}

        return heal

    async def _kill_leader(
        self, rng: random.Random, leader: str | None, value: dict[str, Any]
    ) -> Heal:
        value["leader_affected"] = leader is not None
        return await self._kill([self._leader_or_any(rng, leader)], value)

    async def _kill_follower(
        self, rng: random.Random, leader: str | None, value: dict[str, Any]
    ) -> Heal:
        value["leader_affected"] = False
        return await self._kill([rng.choice(self._followers(leader))], value)

    async def _kill_majority(
        self, rng: random.Random, leader: str | None, value: dict[str, Any]
    ) -> Heal:
        victims = sorted(rng.sample(self.nodes, len(self.nodes) // 2 + 1))
        value["leader_affected"] = True  # killed or not, it has no quorum until the restart
        return await self._kill(victims, value)

    async def _group_restart(
        self, rng: random.Random, leader: str | None, value: dict[str, Any]
    ) -> Heal:
        victims = list(self.nodes)
        rng.shuffle(victims)
        value["leader_affected"] = True
        return await self._kill(victims, value)

    async def _disk_tail(
        self, rng: random.Random, leader: str | None, value: dict[str, Any]
    ) -> Heal:
        victim = rng.choice(self.nodes)
        value["leader_affected"] = victim == leader
        heal = await self._kill([victim], value)
        value["damage"] = self.target.damage_tail(victim, rng.choice(MODES), rng)
        return heal

    async def _pause(self, victim: str, value: dict[str, Any]) -> Heal:
        self.target.pause(victim)
        value["nodes"] = [victim]

        async def heal() -> dict[str, Any]:
            self.target.resume(victim)
            return {"resumed": [victim]}

        return heal

    async def _pause_leader(
        self, rng: random.Random, leader: str | None, value: dict[str, Any]
    ) -> Heal:
        value["leader_affected"] = leader is not None
        return await self._pause(self._leader_or_any(rng, leader), value)

    async def _pause_follower(
        self, rng: random.Random, leader: str | None, value: dict[str, Any]
    ) -> Heal:
        value["leader_affected"] = False
        return await self._pause(rng.choice(self._followers(leader)), value)

    async def _partition(
        self, cut: plans.Partition, leader: str | None, value: dict[str, Any]
    ) -> Heal:
        await self.network.apply(cut)
        value.update(cut.describe())
        value["nodes"] = sorted({n for drop in cut.drops for n in drop})
        if "leader_affected" not in value:
            value["leader_affected"] = leader is not None and not plans.in_majority(
                cut, leader, self.nodes
            )

        async def heal() -> dict[str, Any]:
            await self.network.heal()
            return {"healed": True}

        return heal

    async def _partition_leader(
        self, rng: random.Random, leader: str | None, value: dict[str, Any]
    ) -> Heal:
        return await self._partition(
            plans.isolate(self.nodes, self._leader_or_any(rng, leader)), leader, value
        )

    async def _partition_halves(
        self, rng: random.Random, leader: str | None, value: dict[str, Any]
    ) -> Heal:
        return await self._partition(plans.halves(self.nodes, rng), leader, value)

    async def _partition_bridge(
        self, rng: random.Random, leader: str | None, value: dict[str, Any]
    ) -> Heal:
        return await self._partition(plans.bridge(self.nodes, rng), leader, value)

    async def _partition_oneway(
        self, rng: random.Random, leader: str | None, value: dict[str, Any]
    ) -> Heal:
        src = self._leader_or_any(rng, leader)
        value["leader_affected"] = leader is not None
        return await self._partition(plans.one_way(self.nodes, src), leader, value)
