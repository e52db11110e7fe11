"""dledger-client: talk to a dledger group from the shell.

    dledger-client --peers "n0-127.0.0.1:40911;..." append hello world
    dledger-client --peers ... get 1 --count 10
    dledger-client --peers ... leader | status | transfer n2

Exit status: 0 done, 1 refused or failed, 2 bad command line, 3 outcome unknown (an append
that may or may not have been stored).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import trio

from dledger.client import ClientError, OutcomeUnknown, open_client
from dledger.config import ConfigError, parse_peers
from dledger.exceptions import find

EXIT_FAILED, EXIT_USAGE, EXIT_UNKNOWN = 1, 2, 3


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dledger-client", description="Client for a dledger group.")
    p.add_argument("--peers", required=True, help='"n0-host:port;n1-host:port;..."')
    p.add_argument("--timeout", type=float, default=5.0, help="seconds for the whole command")
    sub = p.add_subparsers(dest="command", required=True)
    a = sub.add_parser("append", help="append each VALUE as one entry (all in one batch)")
    a.add_argument("values", nargs="+")
    g = sub.add_parser("get", help="read committed entries from INDEX on")
    g.add_argument("index", type=int)
    g.add_argument("--count", type=int, default=1)
    g.add_argument("--node", help="read from this replica instead of the leader")
    g.add_argument("--uncommitted", action="store_true", help="include entries not yet committed")
    sub.add_parser("leader", help="print the leader's id and address")
    s = sub.add_parser("status", help="role, term, indexes and peers of each replica")
    s.add_argument("--node", help="only this replica")
    s.add_argument("--json", action="store_true")
    t = sub.add_parser("transfer", help="hand leadership to TARGET")
    t.add_argument("target")
    return p


async def run(args: argparse.Namespace, peers: dict[str, Any]) -> int:
    async with open_client(peers) as client:
        if args.command == "append":
            index = await client.append([v.encode() for v in args.values], timeout=args.timeout)
            first = index - len(args.values) + 1
            print(f"appended at index {first}" + (f"..{index}" if index != first else ""))
        elif args.command == "get":
            entries = await client.get(
                args.index,
                args.count,
                node=args.node,
                committed=not args.uncommitted,
                timeout=args.timeout,
            )
            for e in entries:
                body = e.body.decode(errors="backslashreplace")
                print(f"{e.index}\tterm={e.term}\tkind={e.kind}\tposition={e.position}\t{body}")
        elif args.command == "leader":
            leader = await client.find_leader(timeout=args.timeout)
            if leader is None:
                print("no leader found", file=sys.stderr)
                return EXIT_FAILED
            print(f"{leader}\t{peers[leader]}")
        elif args.command == "status":
            nodes = [args.node] if args.node else list(peers)
            rows = []
            for node in nodes:
                try:
                    rows.append(await client.status(node, timeout=min(args.timeout, 2.0)))
                except (ClientError, trio.TooSlowError) as err:
                    rows.append(
                        {"node": node, "role": "unreachable", "error": str(err) or "timeout"}
                    )
            if args.json:
                print(json.dumps(rows, indent=2))
            else:
                print(format_status(rows))
        elif args.command == "transfer":
            await client.transfer(args.target, timeout=args.timeout)
            print(f"leadership transfer to {args.target} started")
    return 0


def _cell(row: dict[str, Any], key: str) -> str:
    value = row.get(key)
    if key == "role" and row.get("removed_at"):
        return f"{value} (removed at {row['removed_at']})"
    return "" if value is None else str(value)


def format_status(rows: list[dict[str, Any]]) -> str:
    head = ("node", "role", "term", "leader", "first", "last", "commit", "applied", "durable")
    keys = (
        "node",
        "role",
        "term",
        "leader",
        "first_index",
        "last_index",
        "commit_index",
        "applied_index",
        "durable_index",
    )
    table = [head] + [tuple(_cell(r, k) for k in keys) for r in rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(head))]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)) for row in table
    )


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        peers = parse_peers(args.peers)
    except ConfigError as err:
        parser.error(str(err))
    try:
        return trio.run(run, args, peers)
    except Exception as exc:
        unknown = find(exc, OutcomeUnknown)
        if unknown is not None:
            print(f"dledger-client: {unknown}", file=sys.stderr)
            return EXIT_UNKNOWN
        failed = find(exc, (ClientError, trio.TooSlowError))
        if failed is not None:
            print(f"dledger-client: {failed or 'timed out'}", file=sys.stderr)
            return EXIT_FAILED
        raise


if __name__ == "__main__":
    sys.exit(main())
