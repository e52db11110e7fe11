"""The checker can fail: each deliberately broken core is caught by the simulator within a
bounded number of seeds. Seeds are fixed, so this is deterministic, not a matter of luck.

The search uses one-entry AppendEntries (so an old-term entry and a new leader's no-op travel
apart, the precondition of Figure 8), long runs, and a fault mix drawn per seed (swarm) with
"buggify" crashes always on and frequent: these bugs live between a vote and a restart, or
between a leader's fsync and its first replication.
"""

from __future__ import annotations

import random

import attrs
import pytest

from dledger.raft.core import RaftCore
from dledger.raft.sim.run import simulate
from dledger.raft.sim.world import SIM_CONFIG, Faults
from tests.raft.broken import (
    AcksBeforeDurable,
    CommitsPreviousTerm,
    ForgetsVote,
    SkipsVoteReplyTermCheck,
)

SEARCH_CONFIG = attrs.evolve(SIM_CONFIG, append_batch_entries_max=1)
SEARCH_STEPS = 4000
SEARCH_BUGGIFY = (0.5, 1.0)
SEEDS_MAX = 300


def search_faults(seed: int) -> Faults:
    return Faults.swarm(random.Random(seed), buggify=SEARCH_BUGGIFY)


def first_violation(core: type[RaftCore]) -> tuple[int, str] | None:
    for seed in range(SEEDS_MAX):
        r = simulate(
            seed,
            nodes=3,
            steps=SEARCH_STEPS,
            config=SEARCH_CONFIG,
            core_factory=core,
            liveness=False,
            faults=search_faults(seed),
        )
        if not r.ok:
            assert r.violation is not None
            return seed, r.violation
    return None


@pytest.mark.parametrize(
    ("core", "properties"),
    [
        # a leader elected without an entry that was (wrongly) committed: Figure 8
        (CommitsPreviousTerm, {"leader completeness", "committed entries agree"}),
        # a restarted voter votes twice in one term
        (ForgetsVote, {"election safety"}),
        # a crash loses an acked entry, so a committed one is on a minority of disks
        (AcksBeforeDurable, {"committed entries durable"}),
        # a stale or pre-vote grant counted as a vote
        (SkipsVoteReplyTermCheck, {"election safety"}),
    ],
    ids=lambda x: x.__name__ if isinstance(x, type) else "",
)
def test_simulator_catches_broken_core(core: type[RaftCore], properties: set[str]) -> None:
    found = first_violation(core)
    assert found is not None, f"{core.__name__}: no violation in {SEEDS_MAX} seeds"
    seed, violation = found
    prop = violation.split(":")[0]
    assert prop in properties, f"{core.__name__} seed {seed}: unexpected {violation}"


def test_correct_core_passes_the_same_search_settings() -> None:
    """The search settings alone do not produce violations."""
    for seed in range(40):
        r = simulate(
            seed,
            nodes=3,
            steps=SEARCH_STEPS,
            config=SEARCH_CONFIG,
            liveness=False,
            faults=search_faults(seed),
        )
        assert r.ok, f"seed {seed}: {r.violation}\n{r.trace}"
