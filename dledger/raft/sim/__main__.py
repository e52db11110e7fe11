"""python -m dledger.raft.sim --seeds N --nodes 3 --steps S   (or --seed K to replay one)"""

from __future__ import annotations

import argparse
import importlib
import sys
import time

from dledger.raft.sim.run import STEPS_DEFAULT, simulate


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m dledger.raft.sim", description=__doc__)
    which = p.add_mutually_exclusive_group()
    which.add_argument("--seeds", type=int, default=100, help="run seeds 0..N-1 (default 100)")
    which.add_argument("--seed", type=int, help="replay this one seed, printing its trace")
    p.add_argument("--first-seed", type=int, default=0, help="start the sweep here")
    p.add_argument("--nodes", type=int, default=3, choices=range(1, 8), metavar="{1..7}")
    p.add_argument("--steps", type=int, default=STEPS_DEFAULT)
    p.add_argument("--no-liveness", action="store_true", help="skip the heal-and-commit check")
    p.add_argument(
        "--core",
        default="dledger.raft.core:RaftCore",
        help="module:Class of the core to run (tests use it to run deliberately broken cores)",
    )
    args = p.parse_args(argv)
    try:
        module, _, name = args.core.partition(":")
        core = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError) as err:
        p.error(f"--core {args.core}: {err}")
    if args.steps < 1:
        p.error("--steps must be >= 1")
    if args.seeds < 1:
        p.error("--seeds must be >= 1")
    seeds = (
        [args.seed]
        if args.seed is not None
        else range(args.first_seed, args.first_seed + args.seeds)
    )
    t0 = time.monotonic()
    steps = elections = commits = violations = 0
    for seed in seeds:
        r = simulate(
            seed,
            nodes=args.nodes,
            steps=args.steps,
            liveness=not args.no_liveness,
            core_factory=core,
        )
        steps += r.steps
        elections += r.elections
        commits += r.commits
        if args.seed is not None and r.ok:
            print(f"seed {seed}: ok, {r.ticks} ticks, {r.elections} elections, {r.commits} commits")
        if not r.ok:
            violations += 1
            print(f"VIOLATION seed={seed} nodes={args.nodes} steps={args.steps}: {r.violation}")
            print(r.trace)
            replay = f"--seed {seed} --nodes {args.nodes} --steps {args.steps} --core {args.core}"
            print(f"replay: python -m dledger.raft.sim {replay}")
    print(
        f"seeds={len(seeds)} nodes={args.nodes} steps={steps} elections={elections} "
        f"commits={commits} violations={violations} seconds={time.monotonic() - t0:.1f}"
    )
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
