"""Entries committed per second by three Raft cores in memory, by proposal batch size.

    python -m bench.raft_core [--quick] [--out bench/results/raft_core.json]

Three cores, in-memory logs, a lossless network that delivers every message at once, fsync
free; no safety checker. What is left is the core's own work per proposal and per entry, so
the figure shows whether batching amortises it (a core that loops over entries in Python
would not get faster per entry as batches grow).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from collections import deque
from pathlib import Path

from dledger.raft.config import RaftConfig
from dledger.raft.core import RaftCore
from dledger.raft.entries import EntryId
from dledger.raft.events import Effects, HardState, Persisted, Propose, Proposed, Role, Tick
from dledger.raft.membership import Membership
from dledger.raft.messages import Envelope
from dledger.raft.sim.memlog import MemLog

ENTRY_BYTES = 1024
BATCHES = (1, 64, 1024)
CONFIG = RaftConfig(append_batch_entries_max=4096, inflight_max=8)


class Group:
    def __init__(self) -> None:
        ids = ["n0", "n1", "n2"]
        membership = Membership(frozenset(ids))
        self.logs = {i: MemLog() for i in ids}
        self.cores = {
            i: RaftCore(
                i,
                CONFIG,
                self.logs[i],
                HardState(),
                initial_membership=membership,
                rng=random.Random(k),
            )
            for k, i in enumerate(ids)
        }
        self.queue: deque[Envelope] = deque()
        leader = self.cores["n0"]
        leader.election_elapsed = leader.randomized_timeout
        self.perform("n0", leader.step(Tick()))
        self.settle()
        assert leader.role is Role.LEADER

    def perform(self, node: str, fx: Effects) -> None:
        self.queue.extend(fx.send_now)
        if fx.persist is not None:
            log = self.logs[node]
            log.write(fx.persist)
            through = log.fsync()
            self.queue.extend(fx.send_after_persist)
            if fx.persist.append is not None:
                self.perform(
                    node, self.cores[node].step(Persisted(EntryId(through.index, through.term)))
                )
        else:
            self.queue.extend(fx.send_after_persist)

    def settle(self) -> None:
        queue, cores = self.queue, self.cores
        while queue:
            env = queue.popleft()
            self.perform(env.to, cores[env.to].step(env.message))


def run(batch: int, entries: int) -> dict[str, float]:
    group = Group()
    leader = group.cores["n0"]
    payloads = [os.urandom(ENTRY_BYTES) for _ in range(batch)]
    start_commit = leader.commit_index
    rounds = max(1, entries // batch)
    t0 = time.perf_counter()
    for _ in range(rounds):
        fx = leader.step(Propose(payloads))
        assert isinstance(fx.result, Proposed), fx.result
        group.perform("n0", fx)
        group.settle()
    elapsed = time.perf_counter() - t0
    committed = leader.commit_index - start_commit
    assert committed == rounds * batch, (committed, rounds * batch)
    return {
        "batch": batch,
        "entries": committed,
        "seconds": round(elapsed, 4),
        "entries_per_s": round(committed / elapsed),
        "us_per_entry": round(elapsed / committed * 1e6, 3),
        "us_per_batch": round(elapsed / rounds * 1e6, 1),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.raft_core", description=__doc__)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--out", type=Path, default=Path("bench/results/raft_core.json"))
    args = p.parse_args(argv)
    entries = 20_000 if args.quick else 200_000
    results = []
    print(f"{'batch':>6} {'entries/s':>12} {'us/entry':>10} {'us/batch':>10}")
    for batch in BATCHES:
        r = run(batch, entries if batch > 1 else entries // 10)
        results.append(r)
        print(
            f"{r['batch']:>6} {r['entries_per_s']:>12,} {r['us_per_entry']:>10} {r['us_per_batch']:>10}"
        )
    per_entry = {r["batch"]: r["us_per_entry"] for r in results}
    report = {
        "what": "raft_core",
        "nodes": 3,
        "entry_bytes": ENTRY_BYTES,
        "quick": args.quick,
        "results": results,
        "per_entry_cost_ratio_1_to_1024": round(per_entry[1] / per_entry[1024], 1),
        "python": sys.version.split()[0],
        "cpu_count": os.cpu_count(),
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "method": "three RaftCores with in-memory logs in one process; every message delivered at "
        "once, every write fsynced at once, no invariant checks; the leader proposes one batch, "
        "the group settles, repeat; entries/s = committed entries / wall time",
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"per-entry cost, batch 1 vs 1024: {report['per_entry_cost_ratio_1_to_1024']}x")
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
