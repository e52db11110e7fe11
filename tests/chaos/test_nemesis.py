"""The nemesis against a fake target and network (no processes, trio's autojump clock): what
it does for each fault kind, in what order, and what it records."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

from chaos.availability import fault_windows
from chaos.final import NO_FINAL_READ, FinalState
from chaos.history import NEMESIS, HistoryWriter, Phase, RunClock
from chaos.nemesis import Nemesis
from chaos.partition import Partition
from chaos.schedule import FAULTS, LOG_FAULTS, PlannedFault
from chaos.targets.base import Crash


@attrs.define
class FakeWorld:
    """Target and network at once: every action is logged with how many records the history
    held when it happened."""

    history: HistoryWriter
    nodes: list[str] = attrs.Factory(lambda: ["n0", "n1", "n2"])
    group: str = "g"
    leading: str | None = "n1"
    recovers: bool = True
    actions: list[tuple[str, Any, int]] = attrs.Factory(list)
    down: set[str] = attrs.Factory(set)

    def _log(self, what: str, arg: Any = None) -> None:
        self.actions.append((what, arg, len(self.history.ops)))

    def kill(self, node: str) -> None:
        self.down.add(node)
        self._log("kill", node)

    def pause(self, node: str) -> None:
        self._log("pause", node)

    def resume(self, node: str) -> None:
        self._log("resume", node)

    def start(self, node: str) -> None:
        self.down.discard(node)
        self._log("start", node)

    def running(self, node: str) -> bool:
        return node not in self.down

    async def leader(self) -> str | None:
        return self.leading

    async def wait_leader(self, timeout_s: float) -> str | None:
        return self.leading

    async def wait_recovered(self, timeout_s: float) -> bool:
        await trio.sleep(0.5 if self.recovers else timeout_s)
        return self.recovers

    async def wait_converged(self, timeout_s: float) -> bool:
        return True

    async def read_final(self) -> FinalState:
        return NO_FINAL_READ

    def damage_tail(self, node: str, mode: str, rng: random.Random) -> dict[str, Any]:
        assert node in self.down, "disk damage before the kill"
        self._log("damage", node)
        return {"mode": mode}

    def recovery_note(self, node: str) -> str | None:
        return "cut_bytes=1"

    def check_crashes(self, now_ns: int) -> list[Crash]:
        return []

    def stop_all(self) -> None:
        pass

    async def apply(self, partition: Partition) -> None:
        self._log("apply", partition)

    async def heal(self) -> None:
        self._log("heal")


def nemesis_for(tmp_path: Path, **world: Any) -> tuple[Nemesis, FakeWorld]:
    clock = RunClock(source=lambda: int(trio.current_time() * 1e9))  # virtual time
    history = HistoryWriter(tmp_path / "history.jsonl", clock)
    fake = FakeWorld(history, **world)
    return Nemesis(fake, fake, history, iter(())), fake


def planned(kind: str, hold_s: float = 2.0) -> PlannedFault:
    return PlannedFault(number=1, kind=kind, hold_s=hold_s, interval_s=10.0, seed=4)


@pytest.mark.parametrize("kind", sorted(LOG_FAULTS))
async def test_every_fault_is_recorded_before_it_acts_and_healed_after(
    tmp_path: Path, kind: str, autojump_clock: trio.abc.Clock
) -> None:
    nemesis, world = nemesis_for(tmp_path)
    await nemesis.execute(planned(kind))
    ops = world.history.ops
    assert [(op.f if op.f == "recover" else "fault", op.phase) for op in ops] == [
        ("fault", Phase.INVOKE),
        ("fault", Phase.OK),
        ("recover", Phase.INVOKE),
        ("recover", Phase.OK),
    ]
    assert all(op.process == NEMESIS for op in ops)
    invoke, healed = ops[0], ops[1]
    assert invoke.f == FAULTS[kind].f and invoke.value["fault"] == kind
    assert invoke.value["leader"] == "n1" and invoke.value["nodes"]
    assert all(seen >= 1 for _, _, seen in world.actions), "acted before recording"
    undo = [a for a in world.actions if a[0] in ("start", "resume", "heal")]
    assert undo and all(seen == 1 for _, _, seen in undo), "healed after the ok record"
    assert healed.time_ns - invoke.time_ns >= 2 * 10**9  # held for hold_s
    [window] = fault_windows(ops)
    assert window.kind == kind and window.end_ns == healed.time_ns


async def test_faults_on_the_leader_hit_the_leader(
    tmp_path: Path, autojump_clock: trio.abc.Clock
) -> None:
    for kind in ("kill-leader", "pause-leader", "partition-leader", "partition-oneway"):
        nemesis, world = nemesis_for(tmp_path, leading="n2")
        await nemesis.execute(planned(kind))
        value = world.history.ops[0].value
        assert value["nodes"] == ["n2"] and value["leader_affected"] is True, kind
    for kind in ("kill-follower", "pause-follower"):
        nemesis, world = nemesis_for(tmp_path, leading="n2")
        await nemesis.execute(planned(kind))
        value = world.history.ops[0].value
        assert value["nodes"] != ["n2"] and value["leader_affected"] is False, kind


async def test_disk_damage_happens_while_the_replica_is_down(
    tmp_path: Path, autojump_clock: trio.abc.Clock
) -> None:
    nemesis, world = nemesis_for(tmp_path)
    await nemesis.execute(planned("disk-tail"))
    assert [a[0] for a in world.actions] == ["kill", "damage", "start"]
    healed, recovered = world.history.ops[1], world.history.ops[3]
    assert healed.value["damage"] == {"mode": healed.value["damage"]["mode"]}
    assert recovered.value["store_recovery"] == {world.actions[0][1]: "cut_bytes=1"}


async def test_a_cluster_that_does_not_recover_is_recorded_and_counted(
    tmp_path: Path, autojump_clock: trio.abc.Clock
) -> None:
    nemesis, world = nemesis_for(tmp_path, recovers=False)
    await nemesis.execute(planned("kill-follower"))
    last = world.history.ops[-1]
    assert (last.f, last.phase) == ("recover", Phase.INFO) and "not recovered" in str(last.error)
    assert nemesis.not_recovered == 1


async def test_a_stopped_run_completes_the_fault_as_info(
    tmp_path: Path, autojump_clock: trio.abc.Clock
) -> None:
    nemesis, world = nemesis_for(tmp_path)
    with trio.move_on_after(1.0):
        await nemesis.execute(planned("pause-leader", hold_s=5.0))
    invoke, stopped = world.history.ops
    assert (stopped.phase, stopped.error) == (Phase.INFO, "the run was stopped")
    assert stopped.f == invoke.f == "pause"
