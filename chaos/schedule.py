"""Which faults a scenario injects, for how long and how far apart: a pure, seeded plan, so a
run's schedule is a function of its seed (which node a fault hits is chosen when it is
injected, from the fault's own seed, since it depends on who leads then).
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator

import attrs

# Server defaults (dledger.limits): a pause or partition must outlast the longest election
# timeout, or it tests nothing.
ELECTION_TIMEOUT_MAX_S = 1.0


@attrs.frozen
class FaultSpec:
    f: str  # the history's `f` for this fault
    hold_s: tuple[float, float]  # how long the fault stays in force, drawn uniformly
    hits_leader: bool  # injected on the leader by design (failover is what it measures)


FAULTS: dict[str, FaultSpec] = {
    "kill-leader": FaultSpec("kill", (2.0, 5.0), True),
    "kill-follower": FaultSpec("kill", (2.0, 5.0), False),
    "kill-majority": FaultSpec("kill", (2.0, 4.0), False),
    "pause-leader": FaultSpec(
        "pause", (1.5 * ELECTION_TIMEOUT_MAX_S, 3 * ELECTION_TIMEOUT_MAX_S), True
    ),
    "pause-follower": FaultSpec(
        "pause", (1.5 * ELECTION_TIMEOUT_MAX_S, 3 * ELECTION_TIMEOUT_MAX_S), False
    ),
    "partition-leader": FaultSpec("partition", (3.0, 8.0), True),
    "partition-halves": FaultSpec("partition", (3.0, 8.0), False),
    "partition-bridge": FaultSpec("partition", (3.0, 8.0), False),
    "partition-oneway": FaultSpec("partition", (3.0, 8.0), True),
    "group-restart": FaultSpec("restart", (1.0, 2.0), True),
    "disk-tail": FaultSpec("disk", (1.0, 2.0), False),
    # the broker target's own: name servers, and a leadership transfer by mqadmin's API
    "kill-namesrv": FaultSpec("namesrv", (2.0, 5.0), False),
    "namesrvs-down": FaultSpec("namesrv", (3.0, 8.0), False),
    "transfer-leader": FaultSpec("transfer", (0.5, 1.0), True),
    # the harness's clients cut off from a group's leader while its peers still see it
    "client-cut-leader": FaultSpec("partition", (3.0, 8.0), True),
}
BROKER_ONLY_FAULTS = frozenset(
    {"kill-namesrv", "namesrvs-down", "transfer-leader", "client-cut-leader"}
)
LOG_FAULTS = tuple(k for k in FAULTS if k not in BROKER_ONLY_FAULTS)

SCENARIOS: dict[str, tuple[str, ...]] = {
    "leader-kill": ("kill-leader",),
    "follower-kill": ("kill-follower",),
    "majority-kill": ("kill-majority",),
    "pause": ("pause-leader", "pause-follower"),
    "partition-leader": ("partition-leader",),
    "partition-halves": ("partition-halves",),
    "partition-bridge": ("partition-bridge",),
    "partition-oneway": ("partition-oneway",),
    "group-restart": ("group-restart",),
    "disk-tail": ("disk-tail",),
    # a leader kill, a partition and a pause, in turn: the default test's short run
    "mixed": ("kill-leader", "partition-leader", "pause-leader"),
    "random": LOG_FAULTS,  # drawn, not cycled
}
# The broker target (`--target broker`): every log-level scenario on the replicas of a group
# (drawn per fault), and faults of the name servers and of leadership.
BROKER_SCENARIOS: dict[str, tuple[str, ...]] = {
    **{name: kinds for name, kinds in SCENARIOS.items() if name not in ("mixed", "random")},
    "namesrv-kill": ("kill-namesrv",),
    "namesrvs-down": ("namesrvs-down",),
    "leader-transfer": ("transfer-leader",),
    "client-cut": ("client-cut-leader",),
    # a leader kill and a partition of the leader, in turn: the default test's short run
    "mixed": ("kill-leader", "partition-leader"),
    # every way a leader goes away, in turn: what the producer's failover time is measured on
    "failover": ("kill-leader", "partition-leader", "pause-leader"),
    "random": tuple(FAULTS),
}
DRAWN = frozenset({"random"})

# Seconds from one fault's start to the next one's, drawn uniformly; a fault and the
# recovery after it may stretch that, and a quiet gap always follows recovery.
INTERVAL_S: dict[str, tuple[float, float]] = {"random": (10.0, 20.0)}
INTERVAL_S_DEFAULT = (6.0, 10.0)
QUIET_S_MIN = 1.0  # appends on a healthy cluster between a recovery and the next fault
WARMUP_S = 2.0  # the workload runs this long before the first fault


@attrs.frozen
class PlannedFault:
    number: int  # 1, 2, ... in the run
    kind: str  # a key of FAULTS
    hold_s: float
    interval_s: float  # to the next fault's start
    seed: int  # for choices made at injection (which follower, which half, ...)

    @property
    def spec(self) -> FaultSpec:
        return FAULTS[self.kind]


def interval_for(scenario: str) -> tuple[float, float]:
    return INTERVAL_S.get(scenario, INTERVAL_S_DEFAULT)


def plan(
    scenario: str,
    rng: random.Random,
    interval_s: tuple[float, float] | None = None,
    scenarios: dict[str, tuple[str, ...]] = SCENARIOS,
) -> Iterator[PlannedFault]:
    """An endless seeded stream of faults; the nemesis takes them while time allows.
    `scenarios` is the target's table (SCENARIOS, or BROKER_SCENARIOS)."""
    if scenario not in scenarios:
        raise ValueError(f"unknown scenario {scenario!r}; one of {', '.join(scenarios)}")
    kinds = scenarios[scenario]
    low, high = interval_s or interval_for(scenario)
    assert 0 < low <= high, (low, high)
    cycle = itertools.cycle(kinds)
    for number in itertools.count(1):
        kind = rng.choice(kinds) if scenario in DRAWN else next(cycle)
        spec = FAULTS[kind]
        yield PlannedFault(
            number=number,
            kind=kind,
            hold_s=round(rng.uniform(*spec.hold_s), 3),
            interval_s=round(rng.uniform(low, high), 3),
            seed=rng.getrandbits(32),
        )
