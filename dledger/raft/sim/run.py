"""One simulated run per seed: faults for a while, then a check that the group recovers.

`python -m dledger.raft.sim --seed 7 --nodes 3 --steps 3000` replays one run exactly.
"""

from __future__ import annotations

import traceback

import attrs

from dledger.raft.config import RaftConfig
from dledger.raft.core import RaftCore
from dledger.raft.sim.invariants import Violation
from dledger.raft.sim.world import SIM_CONFIG, CoreFactory, Faults, World

STEPS_DEFAULT = 3000
LIVENESS_TICKS_PER_ELECTION = 30  # after healing: a leader and a commit within 30 max timeouts


@attrs.frozen
class RunResult:
    seed: int
    nodes: int
    steps: int
    ticks: int
    elections: int
    commits: int  # highest committed index
    violation: str | None  # the failed property and what broke it
    stats: dict[str, int]  # faults injected and rare paths taken
    trace: str  # the last lines of the run, for a failing seed

    @property
    def ok(self) -> bool:
        return self.violation is None


def simulate(
    seed: int,
    *,
    nodes: int = 3,
    steps: int = STEPS_DEFAULT,
    faults: Faults | None = None,
    core_factory: CoreFactory = RaftCore,
    config: RaftConfig = SIM_CONFIG,
    liveness: bool = True,
) -> RunResult:
    """`faults=None` draws a fault mix from the seed (swarm testing)."""
    world = World(seed, nodes=nodes, faults=faults, core_factory=core_factory, config=config)
    violation: str | None = None
    try:
        for _ in range(steps):
            world.step()
        if liveness:
            world.heal()
            ticks_max = LIVENESS_TICKS_PER_ELECTION * world.config.election_ticks_max
            if not world.commit_new_entry(ticks_max):
                leader = world.leader()
                violation = (
                    f"liveness: no new entry committed on every member within {ticks_max} ticks "
                    f"after healing (leader: {leader.id if leader else None})"
                )
    except Violation as v:
        violation = str(v)
    except AssertionError as e:  # a core assertion is a safety bug found by this seed
        violation = f"core assertion: {e}\n{traceback.format_exc(limit=4)}"
    return RunResult(
        seed=seed,
        nodes=nodes,
        steps=world.steps,
        ticks=world.now,
        elections=world.checker.elections,
        commits=len(world.checker.committed_terms),
        violation=violation,
        stats=dict(world.stats),
        trace=world.format_trace() if violation else "",
    )
