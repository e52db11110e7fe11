"""dledger-chaos: real faults against a real dledger-server group, and the checkers.

    dledger-chaos run --target dledger --scenario leader-kill --duration 60 --seed 7 \\
        --out runs/leader-kill [--nodes 3|5]
    dledger-chaos run --target broker --scenario mixed --duration 60 --seed 7 \\
        --out runs/broker-mixed [--groups 2] [--nodes 3] [--namesrvs 2]
    dledger-chaos check runs/leader-kill      re-judge a saved run, rewrite its report
    dledger-chaos cleanup runs/leader-kill    remove what a run killed with -9 left behind

Exit status: 0 when every must-hold check holds, 1 when one does not or the run could not be
judged (no complete final read, e.g. interrupted: verdict "unknown"), 2 when the run could
not be set up (the reason on stderr, e.g. exactly which capability is missing), for a bad
command line, or when the harness itself failed (a traceback, and no verdict).
"""

from __future__ import annotations

import argparse
import sys
import traceback
from pathlib import Path
from typing import Any

from chaos.history import HistoryUnreadable
from chaos.run import RunConfig, SetupFailed, check_saved, cleanup_saved, run
from chaos.run_config import FLUSH_POLICIES
from chaos.schedule import BROKER_SCENARIOS, SCENARIOS

EXIT_SETUP = 2


def _interval(text: str) -> tuple[float, float]:
    low, sep, high = text.partition("-")
    try:
        pair = (float(low), float(high if sep else low))
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"{text!r} is not MIN-MAX seconds, e.g. 10-20") from err
    if not 0 < pair[0] <= pair[1]:
        raise argparse.ArgumentTypeError(f"{text!r}: need 0 < MIN <= MAX")
    return pair


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dledger-chaos", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="run a scenario against a fresh group and judge it")
    r.add_argument(
        "--target",
        default="dledger",
        choices=["dledger", "broker"],
        help="dledger: a dledger-server group; broker: name servers and dledger-broker groups",
    )
    r.add_argument(
        "--scenario",
        required=True,
        choices=list(dict.fromkeys([*SCENARIOS, *BROKER_SCENARIOS])),
        help="broker only: namesrv-kill, namesrvs-down, leader-transfer",
    )
    r.add_argument("--duration", type=float, default=60.0, help="seconds of workload and faults")
    r.add_argument("--seed", type=int, default=7, help="the fault schedule and every choice in it")
    r.add_argument("--out", type=Path, required=True, help="run directory, e.g. runs/leader-kill")
    r.add_argument("--nodes", type=int, default=3, help="replicas in the group (3 or 5)")
    r.add_argument("--groups", type=int, default=2, help="broker target: broker groups")
    r.add_argument("--namesrvs", type=int, default=2, help="broker target: name servers")
    r.add_argument(
        "--workers",
        type=int,
        help="concurrent appending clients (default 4); broker: plain senders (default 3)",
    )
    r.add_argument(
        "--op-timeout",
        type=float,
        help="deadline of each append, s (default 1.0); broker: of each send (default 3.0)",
    )
    r.add_argument(
        "--interval",
        type=_interval,
        help="seconds between fault starts, MIN-MAX (10-20 for random)",
    )
    r.add_argument(
        "--keep-stores", action="store_true", help="copy the replicas' stores to OUT/stores"
    )
    r.add_argument(
        "--flush",
        choices=FLUSH_POLICIES,
        help="broker target: the brokers' flushDiskType (default: theirs, ASYNC_FLUSH)",
    )
    c = sub.add_parser("check", help="re-run the checkers on a saved run and rewrite its report")
    c.add_argument("run_dir", type=Path)
    k = sub.add_parser(
        "cleanup", help="remove the namespaces and scratch files of a run that was killed -9"
    )
    k.add_argument("run_dir", type=Path)
    return p


def summary(report: dict[str, Any], out: Path) -> str:
    if report.get("run", {}).get("target") == "broker":
        return broker_summary(report, out)
    f = report["failover_ms"]
    return (
        f"verdict {report['verdict'].upper()}: acked {report['acked']}, lost {report['acked_lost']}, "
        f"order violations {report['order_violations']}, replicas agree {report['replicas_agree']}, "
        f"duplicates {report['duplicates']}, unknown in log {report['unknown_in_log']}, "
        f"faults {sum(report['faults'].values())}, failover ms p50 {f['p50']} p99 {f['p99']} "
        f"max {f['max']}"
        + (f"\n  because: {'; '.join(report['reasons'])}" if report["reasons"] else "")
        + f"\n  report: {out / 'report.md'}"
    )


def broker_summary(report: dict[str, Any], out: Path) -> str:
    f = report["failover_ms"]
    unconsumed = sum(report["acked_unconsumed"].values())
    groups = "; ".join(
        f"{g}: acked {x['acked']}, lost {x['lost']}, longest without SEND_OK "
        f"{x['longest_no_ok_ms']} ms"
        for g, x in report["groups"].items()
    )
    return (
        f"verdict {report['verdict'].upper()}: acked {report['acked']}, lost "
        f"{report['acked_lost']}, unconsumed {unconsumed}, order violations "
        f"{report['order_violations']}, queue problems {report['queue_problems']}, rewinds "
        f"beyond bound {report['rewinds_beyond_bound']}, duplicates {report['duplicates_in_log']}, "
        f"redelivered {sum(report['redelivered'].values())}, crashes {report['process_crashes']}, "
        f"faults {sum(report['faults'].values())}, failover ms p50 {f['p50']} p99 {f['p99']} "
        f"max {f['max']}\n  {groups}"
        + (f"\n  because: {'; '.join(report['reasons'])}" if report["reasons"] else "")
        + f"\n  report: {out / 'report.md'}"
    )


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "run":
            config = RunConfig(
                scenario=args.scenario,
                duration_s=args.duration,
                seed=args.seed,
                out=args.out,
                target=args.target,
                nodes=args.nodes,
                workers=args.workers or (3 if args.target == "broker" else 4),
                op_timeout_s=args.op_timeout or (3.0 if args.target == "broker" else 1.0),
                interval_s=args.interval,
                keep_stores=args.keep_stores,
                groups=args.groups,
                namesrvs=args.namesrvs,
                flush=args.flush,
            )
            outcome = run(config)
            out = args.out
        elif args.command == "cleanup":
            removed = cleanup_saved(args.run_dir)
            print("removed: " + (", ".join(removed) if removed else "nothing was left"))
            return 0
        else:
            outcome = check_saved(args.run_dir)
            out = args.run_dir
    except SetupFailed as err:
        print(f"dledger-chaos: {err}", file=sys.stderr)
        return EXIT_SETUP
    except HistoryUnreadable as err:
        print(f"dledger-chaos: {err}", file=sys.stderr)
        return EXIT_SETUP
    except KeyboardInterrupt:
        print(
            "dledger-chaos: interrupted during setup; everything started was cleaned up",
            file=sys.stderr,
        )
        return EXIT_SETUP
    except Exception:  # a harness bug: the run could not be judged, which is no verdict
        traceback.print_exc()
        print("dledger-chaos: internal error (a bug in the harness): no verdict", file=sys.stderr)
        return EXIT_SETUP
    print(summary(outcome.report, out))
    return outcome.exit_code


if __name__ == "__main__":
    sys.exit(main())
