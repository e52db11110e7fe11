"""The deterministic simulator: seed sweeps with every fault, replay, and its own parts."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter

import attrs
import pytest

from dledger.raft.entries import EntryBatch, EntryId, EntryKind
from dledger.raft.events import ChangeMembership, Persist
from dledger.raft.membership import ChangeKind, Membership
from dledger.raft.sim.invariants import Checker
from dledger.raft.sim.memlog import MemLog
from dledger.raft.sim.run import simulate
from dledger.raft.sim.world import Faults, World

SEEDS_PER_CHUNK = 50
CHUNKS = 4  # 200 seeds per cluster size in the default run (it has a 20-minute budget);
# `./dev.sh soak` runs 20,000


def _sweep(nodes: int, first: int, count: int) -> None:
    for seed in range(first, first + count):
        r = simulate(seed, nodes=nodes)
        assert r.ok, (
            f"{r.violation}\nreplay: python -m dledger.raft.sim --seed {seed} --nodes {nodes}"
            f"\n{r.trace}"
        )


@pytest.mark.parametrize("chunk", range(CHUNKS))
def test_seeds_3_nodes(chunk: int) -> None:
    _sweep(3, chunk * SEEDS_PER_CHUNK, SEEDS_PER_CHUNK)


@pytest.mark.parametrize("chunk", range(CHUNKS))
def test_seeds_5_nodes(chunk: int) -> None:
    _sweep(5, chunk * SEEDS_PER_CHUNK, SEEDS_PER_CHUNK)


def test_sweep_exercises_every_fault_and_rare_path() -> None:
    """A sweep that never crashed a node or reset a log would prove little."""
    seen: Counter[str] = Counter()
    for seed in range(60):
        seen.update(simulate(seed, nodes=3).stats)
    for what in (
        "crash",
        "restart",
        "buggify",
        "partition halves",
        "partition isolate-leader",
        "partition bridge",
        "partition one-way",
        "disconnect",
        "transfer",
        "membership add-voter",
        "membership remove",
        "compaction",
        "log reset",
        "truncation",
        "told removed",
        "quiet tick",  # a Tick the core said would only count did nothing (RaftCore.quiet_ticks)
    ):
        assert seen[what] > 0, f"no seed exercised {what}: {sorted(seen.items())}"


def test_same_seed_same_run() -> None:
    a, b = simulate(11, nodes=5), simulate(11, nodes=5)
    assert a == b


def test_replay_does_not_depend_on_hash_seed() -> None:
    """Sets of node ids must never order anything: a seed replays in any process."""
    code = (
        "from dledger.raft.sim.run import simulate; r = simulate(5, nodes=5);"
        "print(r.ticks, r.elections, r.commits, sorted(r.stats.items()))"
    )
    outs = set()
    for hash_seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        outs.add(
            subprocess.run(
                [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
            ).stdout
        )
    assert len(outs) == 1, outs


class TestCli:
    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "dledger.raft.sim", *args], capture_output=True, text=True
        )

    def test_summary_line(self) -> None:
        p = self.run("--seeds", "3", "--nodes", "3", "--steps", "500")
        assert p.returncode == 0, p.stdout + p.stderr
        last = p.stdout.strip().splitlines()[-1]
        assert last.startswith("seeds=3 nodes=3 steps=")
        for key in ("elections=", "commits=", "violations=0"):
            assert key in last

    def test_replay_one_seed(self) -> None:
        p = self.run("--seed", "4", "--steps", "500")
        assert p.returncode == 0
        assert "seed 4: ok" in p.stdout

    def test_bad_flags(self) -> None:
        for args in (["--steps", "0"], ["--nodes", "9"], ["--seeds", "x"]):
            p = self.run(*args)
            assert p.returncode == 2, args
            assert "error" in p.stderr

    def test_violation_exits_non_zero_with_seed_and_trace(self) -> None:
        p = self.run("--seeds", "2", "--core", "tests.raft.broken:AcksBeforeDurable")
        assert p.returncode == 1, p.stdout + p.stderr
        assert "VIOLATION seed=0" in p.stdout
        assert "committed entries durable" in p.stdout
        assert "replay: python -m dledger.raft.sim --seed 0" in p.stdout
        assert "violations=2" in p.stdout

    def test_unknown_core(self) -> None:
        p = self.run("--core", "tests.raft.broken:NoSuchCore")
        assert p.returncode == 2 and "NoSuchCore" in p.stderr


class TestMemLog:
    def batch(self, first: int, term: int, n: int) -> EntryBatch:
        return EntryBatch(first, [term] * n, [EntryKind.DATA] * n, [b"x"] * n)

    def test_crash_keeps_only_what_was_fsynced(self) -> None:
        import random

        log = MemLog()
        log.write(Persist(append=self.batch(1, 1, 3)))
        log.fsync()
        log.write(Persist(append=self.batch(4, 1, 2)))
        assert log.durable_index == 3
        for seed in range(20):  # the synced entries always survive; a prefix of the rest may
            copy = MemLog()
            copy.write(Persist(append=self.batch(1, 1, 3)))
            copy.fsync()
            copy.write(Persist(append=self.batch(4, 1, 2)))
            copy.crash(random.Random(seed))
            assert 3 <= copy.last_index <= 5
            assert copy.durable_index == copy.last_index

    def test_unsynced_truncation_can_come_back(self) -> None:
        import random

        for seed in range(20):
            log = MemLog()
            log.write(Persist(append=self.batch(1, 1, 4)))
            log.fsync()
            log.write(Persist(truncate_after=2))
            assert log.durable_index == 2
            log.crash(random.Random(seed))
            assert log.last_index == 4  # the disk still had entries 3 and 4
            assert log.disk_has(EntryId(4, 1))


def test_a_removed_voter_in_a_later_term_does_not_hide_the_leader() -> None:
    """Soak seed 12337 (3 nodes) before the fix: a voter was removed while it was down, came
    back in a later term than the group's and campaigned with pre-votes nobody granted. The
    group went on committing without it, but World.leader() looked for a leader in the top
    term of *any* live node, found none, and the liveness check failed."""
    world = World(5, nodes=4, faults=Faults.none(), spares=0)
    assert world.run_until(lambda: world.leader() is not None, 400)
    leader = world.leader()
    assert leader is not None and leader.core is not None
    removed = next(n for n in world.nodes.values() if n is not leader)
    world.crash(removed)
    world.feed(leader, ChangeMembership(ChangeKind.REMOVE, removed.id))

    def removal_committed() -> bool:
        current = world.leader()
        return (
            current is not None
            and current.core is not None
            and removed.id not in current.core.membership.members
            and all(n.applied >= n.log.last_index for n in world.members())
        )

    assert world.run_until(removal_committed, 400)
    current = world.leader()
    assert current is not None and current.core is not None
    removed.hard = attrs.evolve(removed.hard, term=current.core.term + 5)
    world.restart(removed)  # it still thinks it is a voter, and is in a later term
    assert removed.core is not None and removed.core.term > current.core.term
    assert world.leader() is current
    assert world.commit_new_entry(400)
    assert removed.core.term > current.core.term  # it never disrupted the group


def test_a_leader_elected_late_in_an_older_term_owes_nothing_to_later_commits() -> None:
    """Soak seed 18302 (5 nodes) before the fix: n3's vote replies for term 13 arrived after n2
    had won term 14 and committed i101/t14, so n3 led term 13 (a stale leader, as Raft
    allows) without that entry, and the checker called it a leader-completeness violation."""
    r = simulate(18302, nodes=5)
    assert r.ok, r.violation


def test_a_node_outside_its_newest_configuration_is_elected_when_only_it_can_win() -> None:
    """Soak seed 7460 (5 nodes) before the fix: n0 and n3 each held an uncommitted
    configuration removing themselves, in the newest logs of the group, so neither campaigned
    and n1 and n4 could not win without one of their votes: no leader after healing. The core
    test with the same shape is test_a_node_outside_its_uncommitted_configuration_campaigns_..."""
    r = simulate(7460, nodes=5)
    assert r.ok, r.violation


def test_committed_before_names_what_a_leader_of_a_term_must_hold() -> None:
    members = Membership(frozenset({"a", "b", "c"}))
    checker = Checker(members)
    # entries 1-2 (terms 1, 1) committed in term 1; 3 (term 2) in term 3, with 4 (term 3)
    checker.on_commit("a", 0, 2, 1, [1, 1], [0, 0], [b"x", b"y"], members, 1)
    checker.on_commit("b", 2, 4, 3, [2, 3], [0, 0], [b"z", b"w"], members, 3)
    assert checker.committed_before(1) is None
    assert checker.committed_before(2) == EntryId(2, 1)
    assert checker.committed_before(3) == EntryId(2, 1)  # entry 3 was committed in term 3
    assert checker.committed_before(4) == EntryId(4, 3)
