"""The nemesis of a broker run: each planned fault goes to one scope of the cluster.

- A log-level fault (kill-leader, pause-follower, partition-halves, disk-tail, ...) hits the
  replicas of one broker group, drawn from the fault's seed, through the log-level nemesis
  (chaos/nemesis.py) over a GroupView: the same planners, the group named in every record.
- client-cut-leader drops, at a group's leader, what the harness's client host sends it (the
  workload's producers and consumers), while its peers and the name servers still reach it:
  the route keeps naming it master, and clients must go through the other replicas, which
  forward writes (chaos.partition.cut_client).
- transfer-leader hands a group's leadership to one of its followers by the admin API
  (mqadmin leadershipTransfer, client/admin_leadership.py) while the workload runs.
- kill-namesrv kills one name server; namesrvs-down kills every one of them; both restart
  them after the hold. Clients keep the routes they have meanwhile.

Every fault is recorded by the nemesis process as in a log-level run (invoke, ok when healed,
then the recovery wait), with "group" set (None for the name servers) so the report can say
what each group went through.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from typing import Any

import attrs
import trio

from chaos.history import HistoryWriter
from chaos.nemesis import Injection, Links, Nemesis, run_schedule
from chaos.partition import cut_client
from chaos.schedule import PlannedFault
from chaos.targets.base import Crash
from chaos.targets.broker import BrokerTarget, GroupView
from client.admin import open_admin
from client.errors import MQClientError
from dledger.exceptions import find

TRANSFER_TIMEOUT_S = 10.0  # the transfer, and every name server listing the new master
NAMESRV_KINDS = frozenset({"kill-namesrv", "namesrvs-down"})
GROUP_SEED_SALT = 0x6272  # the group a fault hits is drawn apart from its victims


class GroupNemesis(Nemesis):
    """The log-level faults on one group's replicas, plus a leadership transfer."""

    def __init__(
        self,
        target: BrokerTarget,
        group: str,
        network: Links,
        history: HistoryWriter,
    ) -> None:
        super().__init__(GroupView(target, group), network, history, iter(()), {"group": group})
        self.broker = target
        self.group = group

    @property
    def _planners(self) -> dict[str, Callable[[random.Random, str | None], Injection]]:
        return {
            **super()._planners,
            "transfer-leader": self._transfer,
            "client-cut-leader": self._client_cut,
        }

    def _client_cut(self, rng: random.Random, leader: str | None) -> Injection:
        cut = self._partition(cut_client(self.nodes, self._leader_or_any(rng, leader)), leader)
        # the leader keeps its quorum, but the clients lose it until they go around it
        return attrs.evolve(cut, leader_affected=leader is not None)

    def _transfer(self, rng: random.Random, leader: str | None) -> Injection:
        to = rng.choice([n for n in self.nodes if n != leader])
        raft_id = self.broker.raft_id(to)

        async def apply() -> dict[str, Any]:
            try:
                async with open_admin(self.broker.namesrv_addr) as admin:
                    done = await admin.leadership_transfer(
                        self.group, raft_id, timeout_s=TRANSFER_TIMEOUT_S
                    )
            except Exception as exc:  # the admin's nursery may wrap it in an ExceptionGroup
                err = find(exc, (MQClientError, trio.TooSlowError))
                if err is None:
                    raise
                return {"transfer": f"failed: {err}"}
            return {"transfer": "done", "term": done.term}

        async def heal() -> dict[str, Any]:
            return {}

        return Injection([to], leader is not None, apply, heal, {"to": to})


class NamesrvView:
    """The name servers as a nemesis Target: kill and start them; nobody leads."""

    def __init__(self, target: BrokerTarget) -> None:
        self.target = target
        self.nodes = target.namesrv_hosts
        self.group = "namesrv"

    def kill(self, node: str) -> None:
        self.target.kill(node)

    def pause(self, node: str) -> None:
        self.target.pause(node)

    def resume(self, node: str) -> None:
        self.target.resume(node)

    def start(self, node: str) -> None:
        self.target.start(node)

    def running(self, node: str) -> bool:
        return self.target.running(node)

    async def leader(self) -> str | None:
        return None

    async def wait_leader(self, timeout_s: float) -> str | None:
        return None

    async def wait_recovered(self, timeout_s: float) -> bool:
        return await self.target.wait_recovered(timeout_s)

    async def wait_converged(self, timeout_s: float) -> bool:
        return await self.target.wait_converged(timeout_s)

    async def read_final(self) -> Any:
        raise NotImplementedError("name servers hold no log")

    def damage_tail(self, node: str, mode: str, rng: random.Random) -> dict[str, Any]:
        raise NotImplementedError("name servers hold no store")

    def recovery_note(self, node: str) -> str | None:
        return None

    def check_crashes(self, now_ns: int) -> list[Crash]:
        return self.target.check_crashes(now_ns)

    def stop_all(self) -> None:
        raise NotImplementedError("the run stops the whole cluster")


class NamesrvNemesis(Nemesis):
    def __init__(self, target: BrokerTarget, network: Links, history: HistoryWriter) -> None:
        super().__init__(NamesrvView(target), network, history, iter(()), {"group": None})

    @property
    def _planners(self) -> dict[str, Callable[[random.Random, str | None], Injection]]:
        return {
            "kill-namesrv": lambda rng, _: self._kill([rng.choice(self.nodes)], False),
            "namesrvs-down": lambda rng, _: self._kill(list(self.nodes), False),
        }


class ClusterNemesis:
    """Takes the planned faults and hands each to the nemesis of its scope."""

    def __init__(
        self,
        target: BrokerTarget,
        network: Links,
        history: HistoryWriter,
        faults: Iterator[PlannedFault],
    ) -> None:
        self.history = history
        self.faults = faults
        self.groups = {g: GroupNemesis(target, g, network, history) for g in target.groups}
        self.namesrvs = NamesrvNemesis(target, network, history)
        self.injected = 0
        self._active: Nemesis | None = None

    @property
    def current(self) -> str | None:
        return self._active.current if self._active is not None else None

    @property
    def not_recovered(self) -> int:
        return self.namesrvs.not_recovered + sum(n.not_recovered for n in self.groups.values())

    def scope_of(self, fault: PlannedFault) -> Nemesis:
        if fault.kind in NAMESRV_KINDS:
            return self.namesrvs
        groups = sorted(self.groups)
        return self.groups[random.Random(fault.seed ^ GROUP_SEED_SALT).choice(groups)]

    async def execute(self, fault: PlannedFault) -> None:
        self._active = self.scope_of(fault)
        self.injected += 1
        try:
            await self._active.execute(fault)
        finally:
            self._active = None

    async def run(self, until_s: float) -> None:
        await run_schedule(self.history, self.faults, until_s, self.execute)
