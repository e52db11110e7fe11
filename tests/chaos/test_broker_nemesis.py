"""The broker run's nemesis against a fake cluster (no processes, trio's autojump clock): which
scope each fault goes to, what it does there, and that every record names the group."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

from chaos.broker_nemesis import ClusterNemesis, GroupNemesis
from chaos.history import HistoryWriter, Phase, RunClock
from chaos.partition import Partition
from chaos.schedule import BROKER_SCENARIOS, FAULTS, LOG_FAULTS, PlannedFault, plan
from chaos.targets.base import Crash


@attrs.define
class FakeCluster:
    """Two groups of three replicas and two name servers; every action logged."""

    groups: list[str] = attrs.Factory(lambda: ["broker-a", "broker-b"])
    namesrv_hosts: list[str] = attrs.Factory(lambda: ["namesrv-0", "namesrv-1"])
    namesrv_addr: str = "10.77.0.10:9876;10.77.0.11:9876"
    actions: list[tuple[str, Any]] = attrs.Factory(list)
    down: set[str] = attrs.Factory(set)

    def group_hosts(self, group: str) -> list[str]:
        return [f"{group}-n{i}" for i in range(3)]

    def raft_id(self, host: str) -> str:
        return host.rsplit("-", 1)[1]

    def kill(self, host: str) -> None:
        self.down.add(host)
        self.actions.append(("kill", host))

    def start(self, host: str) -> None:
        self.down.discard(host)
        self.actions.append(("start", host))

    def pause(self, host: str) -> None:
        self.actions.append(("pause", host))

    def resume(self, host: str) -> None:
        self.actions.append(("resume", host))

    def running(self, host: str) -> bool:
        return host not in self.down

    async def leader(self, group: str) -> str | None:
        return f"{group}-n1"

    async def wait_leader(self, group: str, timeout_s: float) -> str | None:
        return f"{group}-n1"

    async def wait_recovered(self, timeout_s: float) -> bool:
        await trio.sleep(0.5)
        return True

    async def wait_converged(self, timeout_s: float) -> bool:
        return True

    def damage_tail(self, host: str, mode: str, rng: random.Random) -> dict[str, Any]:
        assert host in self.down
        self.actions.append(("damage", host))
        return {"mode": mode}

    def recovery_note(self, host: str) -> str | None:
        return None

    def check_crashes(self, now_ns: int) -> list[Crash]:
        return []

    async def apply(self, partition: Partition) -> None:
        self.actions.append(("apply", sorted(partition.drops)))

    async def heal(self) -> None:
        self.actions.append(("heal", None))


def history_at(tmp_path: Path) -> HistoryWriter:
    clock = RunClock(source=lambda: int(trio.current_time() * 1e9))
    return HistoryWriter(tmp_path / "history.jsonl", clock)


def planned(kind: str, seed: int = 4) -> PlannedFault:
    return PlannedFault(number=1, kind=kind, hold_s=2.0, interval_s=10.0, seed=seed)


@pytest.mark.parametrize("kind", sorted(LOG_FAULTS))
async def test_log_level_faults_hit_one_groups_replicas_and_name_it(
    tmp_path: Path, kind: str, autojump_clock: trio.abc.Clock
) -> None:
    history, fake = history_at(tmp_path), FakeCluster()
    nemesis = ClusterNemesis(fake, fake, history, iter(()))  # type: ignore[arg-type]
    await nemesis.execute(planned(kind))
    invoke, healed, recover, recovered = history.ops
    group = invoke.value["group"]
    assert group in fake.groups and invoke.value["fault"] == kind
    assert invoke.f == FAULTS[kind].f and healed.phase is Phase.OK
    assert recover.value["group"] == recovered.value["group"] == group
    assert "applied_ns" in healed.value
    touched = {a[1] for a in fake.actions if a[0] in ("kill", "pause", "start", "damage")}
    for drops in (a[1] for a in fake.actions if a[0] == "apply"):
        touched |= {host for drop in drops for host in drop}
    assert touched and touched <= set(fake.group_hosts(group)), fake.actions


async def test_name_server_faults_kill_and_restart_name_servers(
    tmp_path: Path, autojump_clock: trio.abc.Clock
) -> None:
    history, fake = history_at(tmp_path), FakeCluster()
    nemesis = ClusterNemesis(fake, fake, history, iter(()))  # type: ignore[arg-type]
    await nemesis.execute(planned("namesrvs-down"))
    assert fake.actions == [
        ("kill", "namesrv-0"),
        ("kill", "namesrv-1"),
        ("start", "namesrv-0"),
        ("start", "namesrv-1"),
    ]
    await nemesis.execute(planned("kill-namesrv"))
    assert [a[0] for a in fake.actions[4:]] == ["kill", "start"]
    assert all(op.value["group"] is None for op in history.ops)
    assert history.ops[0].f == "namesrv" and history.ops[0].value["leader_affected"] is False


async def test_a_transfer_that_fails_is_recorded_not_raised(
    tmp_path: Path, autojump_clock: trio.abc.Clock
) -> None:
    """With no name server to ask, the admin API fails; the run goes on and says why."""
    history, fake = history_at(tmp_path), FakeCluster(namesrv_addr="127.0.0.1:1")
    nemesis = GroupNemesis(fake, "broker-b", fake, history)  # type: ignore[arg-type]
    await nemesis.execute(planned("transfer-leader"))
    invoke, healed = history.ops[:2]
    assert invoke.f == "transfer" and invoke.value["to"] in ("broker-b-n0", "broker-b-n2")
    assert invoke.value["leader"] == "broker-b-n1" and invoke.value["leader_affected"] is True
    assert healed.value["transfer"].startswith("failed: ")


async def test_a_client_cut_drops_the_client_hosts_packets_at_the_leader_only(
    tmp_path: Path, autojump_clock: trio.abc.Clock
) -> None:
    """client-cut-leader: one rule at the group's leader against the client host, healed
    after the hold; the leader counts as lost for the clients (failover is measured)."""
    history, fake = history_at(tmp_path), FakeCluster()
    nemesis = GroupNemesis(fake, "broker-a", fake, history)  # type: ignore[arg-type]
    await nemesis.execute(planned("client-cut-leader"))
    invoke, healed = history.ops[:2]
    assert fake.actions == [("apply", [("client", "broker-a-n1")]), ("heal", None)]
    assert invoke.f == "partition" and invoke.value["nodes"] == ["broker-a-n1"]
    assert invoke.value["leader_affected"] is True and invoke.value["partition"] == "client"
    assert healed.value["healed"] is True


def test_the_broker_scenarios_use_only_known_faults_and_random_draws_every_kind() -> None:
    assert all(set(kinds) <= set(FAULTS) for kinds in BROKER_SCENARIOS.values())
    assert BROKER_SCENARIOS["mixed"] == ("kill-leader", "partition-leader")
    drawn = {
        f.kind
        for f, _ in zip(
            plan("random", random.Random(3), None, BROKER_SCENARIOS), range(400), strict=False
        )
    }
    assert drawn == set(FAULTS)
