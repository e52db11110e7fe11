"""dledger-dev: a whole local group for trying things out (milestone 1: one 3-replica log group).

    dledger-dev up [--foreground]   start n0..n2 of group "g" under ./data, ports 40911-40913
    dledger-dev status              one status table
    dledger-dev down                stop what `up` started (by the pids it recorded)

`up --foreground` (what ./dev.sh up runs) keeps a status table on screen and stops the group
on Ctrl-C. Without it, the servers keep running in the background until `down`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import trio

from dledger.cli import format_status
from dledger.client import ClientError, open_client
from dledger.config import Address, parse_peers
from dledger.localgroup import LocalGroup

STATE_FILE = "dev.json"
REFRESH_S = 1.0


def state_path(data: Path) -> Path:
    return data / STATE_FILE


def read_state(data: Path) -> dict[str, Any] | None:
    path = state_path(data)
    return json.loads(path.read_text()) if path.exists() else None


def pid_alive(pid: int, marker: str) -> bool:
    """The pid runs and is still ours (its command line names our store): pids get reused."""
    try:
        cmdline = (
            Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        )
    except OSError:
        return False
    return marker in cmdline


async def statuses(peers: dict[str, Address]) -> list[dict[str, Any]]:
    rows = []
    async with open_client(peers) as client:
        for node in peers:
            try:
                rows.append(await client.status(node, timeout=1.0))
            except (ClientError, trio.TooSlowError) as err:
                rows.append({"node": node, "role": "down", "error": str(err) or "timeout"})
    return rows


def table(peers: dict[str, Address]) -> str:
    rows = trio.run(statuses, peers)
    lines = [format_status(rows)]
    leader = next((r for r in rows if r.get("role") == "leader"), None)
    if leader:
        lags = ", ".join(
            f"{p}: lag {s['lag']}"
            for p, s in leader.get("peers", {}).items()
            if s.get("lag") is not None
        )
        lines.append(f"leader {leader['node']} at {peers[leader['node']]}; followers {lags}")
    else:
        lines.append("no leader")
    return "\n".join(lines)


def up(args: argparse.Namespace) -> int:
    data: Path = args.data
    state = read_state(data)
    if state and any(pid_alive(pid, str(data)) for pid in state["pids"].values()):
        print(
            f"dledger-dev: a group is already running from {data} (dledger-dev down stops it)",
            file=sys.stderr,
        )
        return 1
    ports = [args.base_port + i for i in range(args.nodes)]
    group = LocalGroup(
        data, group=args.group, nodes=args.nodes, ports=ports, extra_args=["--log-level", "INFO"]
    )
    group.start_all()
    try:
        group.wait_serving(timeout=30)
    except TimeoutError:
        group.stop_all()
        logs = {n: group.replicas[n].log_path for n in group.replicas}
        print(f"dledger-dev: the servers did not come up; see {logs}", file=sys.stderr)
        return 1
    state_path(data).write_text(
        json.dumps({"group": args.group, "peers": group.peers_arg, "pids": group.pids()}, indent=2)
        + "\n"
    )
    print(f'group {args.group} started: --peers "{group.peers_arg}"')
    print(
        f'data and logs under {data}; try: dledger-client --peers "{group.peers_arg}" append hello'
    )
    if not args.foreground:
        return 0
    stop = False

    def on_signal(signum: int, frame: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    try:
        while not stop:
            text = table(group.peers)
            if sys.stdout.isatty():
                print(
                    "\x1b[2J\x1b[H"
                    + time.strftime("%H:%M:%S")
                    + "  (Ctrl-C stops the group)\n"
                    + text,
                    flush=True,
                )
            else:
                print(text, flush=True)
            deadline = time.monotonic() + REFRESH_S
            while not stop and time.monotonic() < deadline:
                time.sleep(0.05)
    finally:
        group.stop_all()
        state_path(data).unlink(missing_ok=True)
        print("group stopped")
    return 0


def down(args: argparse.Namespace) -> int:
    state = read_state(args.data)
    if state is None:
        print(f"dledger-dev: nothing started from {args.data}")
        return 0
    for node, pid in state["pids"].items():
        if not pid_alive(pid, str(args.data)):
            continue
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 5
        while pid_alive(pid, str(args.data)) and time.monotonic() < deadline:
            time.sleep(0.05)
        if pid_alive(pid, str(args.data)):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        print(f"stopped {node} (pid {pid})")
    state_path(args.data).unlink(missing_ok=True)
    return 0


def status(args: argparse.Namespace) -> int:
    state = read_state(args.data)
    if state is None:
        print(f"dledger-dev: nothing started from {args.data}", file=sys.stderr)
        return 1
    print(table(parse_peers(state["peers"])))
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="dledger-dev",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--data", type=Path, default=Path("data"), help="where stores, logs and dev.json go"
    )
    sub = p.add_subparsers(dest="command", required=True)
    u = sub.add_parser("up", help="start the group")
    u.add_argument(
        "--foreground", action="store_true", help="show a status table; Ctrl-C stops the group"
    )
    u.add_argument("--group", default="g")
    u.add_argument("--nodes", type=int, default=3, choices=[1, 3, 5])
    u.add_argument("--base-port", type=int, default=40911)
    sub.add_parser("down", help="stop the group")
    sub.add_parser("status", help="print the status table once")
    args = p.parse_args(argv)
    args.data = args.data.resolve()
    return {"up": up, "down": down, "status": status}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
